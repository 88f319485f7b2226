"""The engine's count of waiting requests: requests only, never the inbox's other messages."""

from __future__ import annotations

from pathlib import Path

from models.config import ModelConfig, SchedulerConfig
from models.engine.core import EngineCore
from models.loading.loader import load_model
from models.sampling.params import SamplingParams


def test_an_abort_in_the_inbox_is_not_a_waiting_request(tiny_model_dir: Path) -> None:
    """Regression (overload run: surge_requests_waiting 33 with --max-queued-requests 32 while a
    probe disconnected): the inbox carries aborts too, and `num_waiting` counted its size, so a
    client going away showed as one more request waiting until the loop took the abort."""
    loaded = load_model(ModelConfig(str(tiny_model_dir), device="cpu", dtype="float32"))
    core = EngineCore(loaded, SchedulerConfig(max_model_len=512), publish=lambda outputs: None)  # loop not started
    core.add_request("a", [5, 6, 7], SamplingParams(max_tokens=4))
    core.abort_request("gone")
    core.abort_request("a")
    assert core.num_waiting == 1  # "a" is still in the inbox; the two aborts are not requests
    core._drain_inbox(block=False)  # what the loop does first
    assert core.num_waiting == 0  # "a" joined the queue, then its abort took it out
