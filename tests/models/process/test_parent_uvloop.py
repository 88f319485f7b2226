"""The server's side of the engine process (models/process/parent.py) under uvloop, the event loop
`surge serve` runs on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import uvloop

from models.config import EngineConfig, ModelConfig, SchedulerConfig
from models.process.async_engine import AsyncEngine
from models.process.parent import EngineProcess
from models.sampling.params import SamplingParams
from models.scheduler.sequence import FinishReason

NUM_SEQS, MAX_TOKENS = 16, 300


def test_a_step_message_split_by_a_full_pipe_is_not_read_as_a_dead_engine(tiny_model_dir: Path) -> None:
    # Regression: uvloop makes the watched pipe non-blocking, so a message the child had only
    # partly written (its pipe full while the event loop was busy) raised BlockingIOError, which
    # the server took for the engine process exiting: every request failed and /ready stayed 503.
    async def main() -> tuple[list[FinishReason | None], BaseException | None]:
        config = EngineConfig(
            ModelConfig(str(tiny_model_dir), device="cpu", dtype="float32"),
            SchedulerConfig(max_num_seqs=NUM_SEQS, max_model_len=512, max_num_batched_tokens=512),
            separate_process=True,
        )
        engine = await AsyncEngine.start(config)
        try:
            assert isinstance(engine.core, EngineProcess)
            # 20 alternatives per token: each step's message is several KiB, so the pipe fills fast.
            params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, ignore_eos=True, logprobs=20)
            group = engine.submit([([5, 6, 7], params)] * NUM_SEQS)
            for _ in range(10):
                time.sleep(0.2)  # a busy event loop: the child fills the pipe and blocks mid-message
                await asyncio.sleep(0.01)  # then the loop reads what is there
            reasons: list[FinishReason | None] = []
            async with group:
                async for output in group:
                    if output.finished:
                        reasons.append(output.finish_reason)
            return reasons, engine.core.dead
        finally:
            engine.stop()

    reasons, dead = uvloop.run(main())
    assert dead is None
    assert reasons == [FinishReason.LENGTH] * NUM_SEQS
