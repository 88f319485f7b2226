"""Per-step CPU threads: a burst's prefill runs on `prefill` threads, decode steps on `decode`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from models.config import AUTO_THREADS, ModelConfig, SchedulerConfig
from models.engine.core import EngineCore
from models.engine.outputs import RequestOutput
from models.loading.loader import load_model
from models.runner.cpus import available_cpus
from models.runner.decode_threads import fastest, had_its_cores
from models.runner.threads import (
    StepThreads,
    choose_decode_threads,
    decode_candidates,
    predicted_tokens_per_s,
    step_threads,
)
from models.sampling.params import SamplingParams


@pytest.fixture(autouse=True)
def restore_torch_threads() -> Iterator[None]:
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_a_burst_step_gets_the_prefill_threads_and_the_next_decode_step_goes_back() -> None:
    threads = StepThreads(decode=1, prefill=2, min_prompt_tokens=128)
    threads.before_step(512)
    assert torch.get_num_threads() == 2
    threads.before_step(127)  # a decode step with a short prompt riding along
    assert torch.get_num_threads() == 1
    threads.before_step(0)
    assert torch.get_num_threads() == 1
    threads.before_step(128)
    assert torch.get_num_threads() == 2


def test_the_first_step_sets_the_count_whatever_torch_had() -> None:
    threads = StepThreads(decode=1, prefill=2)
    torch.set_num_threads(3)  # e.g. another thread's count: the object cannot know it
    threads.before_step(0)
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize(
    ("device", "num_threads", "prefill_threads", "expected"),
    [
        ("cpu", 1, 2, (1, 2)),
        ("cpu", 2, 4, (2, 4)),
        ("cpu", 2, 2, None),  # nothing to switch
        ("cpu", 4, 2, None),  # fewer for a burst than for decode: off, not fewer
        ("cpu", 0, 2, None),  # torch's own default count: surge does not manage threads
        ("cuda", 1, 2, None),  # CPU threads only launch kernels there
    ],
)
def test_the_policy_for_a_configuration(
    device: str, num_threads: int, prefill_threads: int, expected: tuple[int, int] | None
) -> None:
    policy = step_threads(torch.device(device), num_threads, prefill_threads)
    assert (None if policy is None else (policy.decode, policy.prefill)) == expected


def test_prefill_threads_0_takes_every_available_cpu() -> None:
    policy = step_threads(torch.device("cpu"), 1, 0)
    cpus = available_cpus()
    assert (policy is None) if cpus == 1 else (policy is not None and policy.prefill == cpus)


def test_the_engine_prefills_a_burst_on_more_threads_and_decodes_on_one(tiny_model_dir: Path) -> None:
    loaded = load_model(
        ModelConfig(str(tiny_model_dir), device="cpu", dtype="float32", num_threads=1, prefill_threads=2)
    )
    assert loaded.threads is not None and (loaded.threads.decode, loaded.threads.prefill) == (1, 2)
    finished = threading.Event()
    outputs: list[RequestOutput] = []

    def publish(batch: list[RequestOutput]) -> None:
        outputs.extend(batch)
        if sum(out.finish_reason is not None for out in outputs) == 6:
            finished.set()

    core = EngineCore(loaded, SchedulerConfig(max_model_len=512), publish)
    seen: list[tuple[int, int]] = []  # (prompt tokens of the step, torch threads during its forward)
    forward = core.runner.forward

    def observed_forward(num_slots: int, chunks: Any, decodes: Any) -> torch.Tensor:
        seen.append((sum(chunk.num_tokens for chunk in chunks), torch.get_num_threads()))
        return forward(num_slots, chunks, decodes)

    core.runner.forward = observed_forward  # type: ignore[method-assign]
    # Six 32-token prompts in the inbox before the loop starts: the first step prefills 192 tokens.
    for i in range(6):
        core.add_request(f"r{i}", [5 + i] * 32, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    core.start()
    try:
        assert finished.wait(60), "the requests did not finish"
    finally:
        core.stop()
    warmup = next(i for i, (tokens, _) in enumerate(seen) if tokens == 192)
    steps = seen[warmup:]
    assert steps[0] == (192, 2)
    assert steps[1:] and all(threads == 1 for tokens, threads in steps[1:] if tokens < 128)
    assert sum(out.num_output_tokens == 4 and out.finish_reason is not None for out in outputs) == 6


def test_auto_starts_on_one_thread_and_asks_warm_up_to_measure() -> None:
    policy = step_threads(torch.device("cpu"), AUTO_THREADS, 4)
    assert policy is not None and (policy.decode, policy.prefill, policy.measure) == (1, 4, True)
    assert step_threads(torch.device("cpu"), AUTO_THREADS, 1) is None  # one CPU: nothing to choose
    assert step_threads(torch.device("cuda"), AUTO_THREADS, 4) is None
    assert not StepThreads(1, 2).measure


def test_the_candidates_are_one_the_powers_of_two_and_every_cpu_but_one() -> None:
    assert decode_candidates(1) == [1]
    assert decode_candidates(2) == [1, 2]
    assert decode_candidates(4) == [1, 2, 3, 4]
    assert decode_candidates(16) == [1, 2, 4, 8, 15, 16]


def test_more_threads_are_chosen_only_where_the_http_side_leaves_them_room() -> None:
    # A 32-row decode step of the tiny m and l on 2 cores, alone (ms at 1 and 2 threads): m's
    # second thread made serving slower (0.85x), l's faster (1.33x).
    size_m, size_l = {1: 6.6e-3, 2: 4.8e-3}, {1: 56e-3, 2: 39e-3}
    assert choose_decode_threads(size_m, rows=32, num_cpus=2) == 1
    assert choose_decode_threads(size_l, rows=32, num_cpus=2) == 2
    # With no HTTP side at all the faster step wins; a gain under MIN_GAIN keeps the fewer threads.
    assert choose_decode_threads(size_m, rows=32, num_cpus=2, http=0.0) == 2
    assert choose_decode_threads({1: 10e-3, 2: 9.8e-3}, rows=32, num_cpus=2, http=0.0) == 1
    # The prediction: alone while the threads and the HTTP side fit on the cores, shared beyond.
    assert predicted_tokens_per_s(0.01, 1, 32, 2, 1e-4) == pytest.approx(3200.0)
    assert predicted_tokens_per_s(0.01, 2, 32, 2, 1e-4) == pytest.approx(3200.0 * 2 / 2.32)


def test_warm_up_measures_the_decode_threads_when_asked(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    loaded = load_model(
        ModelConfig(str(tiny_model_dir), device="cpu", dtype="float32", num_threads=AUTO_THREADS, prefill_threads=2)
    )
    assert loaded.threads is not None and loaded.threads.measure
    core = EngineCore(loaded, SchedulerConfig(max_num_seqs=4, max_model_len=256), lambda outputs: None)
    with caplog.at_level("INFO", logger="surge.engine"):
        core.start()
        try:
            deadline = time.monotonic() + 60
            while not core.is_warm and time.monotonic() < deadline:
                time.sleep(0.01)
            assert core.is_warm
        finally:
            core.stop()
    assert loaded.threads.decode in (1, 2)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("decode threads:"))
    assert "1 thread(s)" in line and "2 thread(s)" in line and "a 4-row decode step" in line


def test_auto_with_one_cpu_to_choose_from_runs_on_that_one(tiny_model_dir: Path) -> None:
    torch.set_num_threads(2)
    loaded = load_model(
        ModelConfig(str(tiny_model_dir), device="cpu", dtype="float32", num_threads=AUTO_THREADS, prefill_threads=1)
    )
    assert loaded.threads is None
    assert torch.get_num_threads() == 1  # not torch's default of every core


def test_a_timing_that_shared_its_cores_is_set_aside() -> None:
    # At start-up the HTTP process imports beside the engine: a 2-thread step that got one core
    # for its wall time is slow for a reason serving will not have.
    assert had_its_cores(cpu_s=0.195, wall_s=0.1, threads=2)
    assert not had_its_cores(cpu_s=0.12, wall_s=0.1, threads=2)
    assert had_its_cores(cpu_s=0.1, wall_s=0.1, threads=1)
    every = {1: [0.15, 0.13], 2: [0.20, 0.09, 0.30]}
    assert fastest({1: [0.15], 2: [0.30]}, every) == {1: 0.15, 2: 0.30}
    assert fastest({1: [], 2: []}, every) == {1: 0.13, 2: 0.09}  # none clean: the fastest of all
    # 2 never clean: the 1-thread timing scaled by the parallel efficiency, if that is faster.
    assert fastest({1: [0.15], 2: []}, {1: [0.15], 2: [0.2, 0.3]}) == {1: 0.15, 2: pytest.approx(0.15 / 1.35)}
    assert fastest({1: [0.15], 2: []}, {1: [0.15], 2: [0.08]}) == {1: 0.15, 2: 0.08}
