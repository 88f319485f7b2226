"""The engine in a child process (models/process/parent.py, models/process/child.py), on the real
tiny model: the same tokens as the engine on a thread, aborts, figures, metrics events, a child
that dies or fails to load, and a clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import models.loading.loader
from models.config import EngineConfig, ModelConfig, SchedulerConfig
from models.engine.outputs import EngineDeadError
from models.process.async_engine import AsyncEngine
from models.process.messages import GpuReport
from models.process.parent import EngineProcess
from models.scheduler.sequence import FinishReason
from tests.models.engine.test_core import RecordingObserver, greedy, prompt, run, tokens, wait_until


def engine_config(model: Path | str, separate_process: bool = True, **scheduler: float) -> EngineConfig:
    scheduler.setdefault("max_model_len", 512)
    scheduler.setdefault("max_num_seqs", 8)
    scheduler.setdefault("max_num_batched_tokens", 64)
    return EngineConfig(
        ModelConfig(str(model), device="cpu", dtype="float32"),
        SchedulerConfig(**scheduler),  # type: ignore[arg-type]
        separate_process=separate_process,
    )


@pytest.fixture(scope="module")
async def observed(tiny_model_dir: Path) -> AsyncIterator[tuple[AsyncEngine, RecordingObserver]]:
    observer = RecordingObserver()
    engine = await AsyncEngine.start(engine_config(tiny_model_dir), observer=observer)
    yield engine, observer
    engine.stop()


def child_of(engine: AsyncEngine) -> EngineProcess:
    assert isinstance(engine.core, EngineProcess)
    return engine.core


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): it is dead for our purpose.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


async def test_tokens_equal_the_engine_on_a_thread(
    observed: tuple[AsyncEngine, RecordingObserver], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, _ = observed
    prompts = [prompt(n, seed=i) for i, n in enumerate([5, 49, 17, 3, 30])]
    lengths = [20, 7, 33, 12, 25]
    in_process = await asyncio.gather(
        *(run(engine.submit([(p, greedy(n))])) for p, n in zip(prompts, lengths, strict=True))
    )
    loaded_on: list[threading.Thread] = []
    load_model = models.loading.loader.load_model

    def recording_load(config: ModelConfig) -> models.loading.loader.LoadedModel:
        loaded_on.append(threading.current_thread())
        return load_model(config)

    monkeypatch.setattr(models.loading.loader, "load_model", recording_load)
    threaded = await AsyncEngine.start(engine_config(tiny_model_dir, separate_process=False))
    try:
        # The model loaded on the thread that runs the loop, not on one of asyncio's workers.
        (loader,) = loaded_on
        assert loader.name == "surge-engine" and loader.is_alive()
        on_thread = await asyncio.gather(
            *(run(threaded.submit([(p, greedy(n))])) for p, n in zip(prompts, lengths, strict=True))
        )
    finally:
        threaded.stop()
    assert not loader.is_alive()  # stop() joined the loop's thread
    # Both timed a decode step of all 8 slots at warmup (the step-time degradation bound reads it).
    assert engine.load_snapshot().full_step_seconds > 0 and threaded.load_snapshot().full_step_seconds > 0
    assert [tokens(o[0]) for o in in_process] == [tokens(o[0]) for o in on_thread]
    assert ["".join(out.text for out in o[0]) for o in in_process] == [
        "".join(out.text for out in o[0]) for o in on_thread
    ]
    assert [o[0][-1].finish_reason for o in in_process] == [FinishReason.LENGTH] * 5
    assert engine.config.scheduler.max_model_len == 512


async def test_stop_strings_and_n_choices_cross_the_pipe(observed: tuple[AsyncEngine, RecordingObserver]) -> None:
    engine, _ = observed
    p = prompt(12, seed=7)
    full = "".join(out.text for out in (await run(engine.submit([(p, greedy(30))])))[0])
    stop = full[5:9]
    assert stop.strip()
    first, second = await run(engine.submit([(p, greedy(30, stop=[stop])), (p, greedy(4))]))
    assert "".join(out.text for out in first) == full[: full.index(stop)]
    assert first[-1].finish_reason is FinishReason.STOP and first[-1].stop_reason == stop
    assert second[-1].finish_reason is FinishReason.LENGTH and sum(len(o.token_ids) for o in second) == 4


async def test_figures_and_metrics_events_reach_the_server(observed: tuple[AsyncEngine, RecordingObserver]) -> None:
    engine, observer = observed
    before = (len(observer.ttfts), observer.num_generated_tokens, len(observer.finishes))
    stats = engine.load.stats
    samples = [len(events.get(0, ())) for events in (stats._queue_times, stats._ttfts, stats._finishes)]
    await run(engine.submit([(prompt(10, 80), greedy(5)), (prompt(12, 81), greedy(3))]))
    # The load figures count the request once (two sequences), as with the engine on a thread.
    assert [len(events[0]) for events in (stats._queue_times, stats._ttfts, stats._finishes)] == [
        n + 1 for n in samples
    ]
    assert len(observer.ttfts) == before[0] + 2
    assert observer.num_generated_tokens == before[1] + 8
    assert observer.finishes[before[2] :] == [FinishReason.LENGTH, FinishReason.LENGTH]
    snapshot = engine.load_snapshot()
    assert snapshot.ttft_p90 > 0 and snapshot.queue_time_p90 >= 0 and snapshot.error_rate == 0
    assert (snapshot.num_running, snapshot.num_waiting, snapshot.kv_usage) == (0, 0, 0.0)
    assert child_of(engine).num_steps > 0


async def test_a_burst_submitted_in_one_loop_iteration_fills_the_first_step(tiny_model_dir: Path) -> None:
    """A burst of streams (one handler each, all in one event-loop iteration) reaches the child in
    one message: its first step prefills all of them. One message per request let the first one
    wake the idle child into a step of its own, and the rest waited a whole step behind it."""
    observer = RecordingObserver()
    config = engine_config(tiny_model_dir, max_num_batched_tokens=512)
    engine = await AsyncEngine.start(config, observer=observer)
    try:
        groups = [engine.submit([(prompt(32, i), greedy(3))]) for i in range(8)]
        results = await asyncio.wait_for(asyncio.gather(*(run(group) for group in groups)), timeout=60)
    finally:
        engine.stop()
    assert all(len(tokens(outputs)) == 3 for (outputs,) in results)
    assert observer.num_seqs[0] == 8  # the first step: every request of the burst


async def test_waiting_and_running_counts_follow_the_child(tiny_model_dir: Path) -> None:
    engine = await AsyncEngine.start(engine_config(tiny_model_dir, max_num_seqs=1, max_num_batched_tokens=32))
    core = child_of(engine)
    try:
        groups = [engine.submit([(prompt(8, i), greedy(400))]) for i in range(3)]
        # Counted as waiting the moment they are sent, before the child reports anything.
        assert core.num_waiting + core.num_running == 3
        await wait_until(lambda: core.num_running == 1 and core.num_waiting == 2)
        assert engine.load_snapshot().kv_usage > 0
        for group in groups:
            group.close()  # aborts, in the queue and in the batch
        await wait_until(lambda: core.num_running == 0 and core.num_waiting == 0)
        assert core.num_aborted == 3 and core.kv_usage == 0.0
        # The slot is free again: a new request runs to the end.
        (outputs,) = await run(engine.submit([(prompt(8, 9), greedy(6))]))
        assert sum(len(o.token_ids) for o in outputs) == 6
    finally:
        engine.stop()


async def test_a_killed_child_fails_open_requests_and_the_engine_reports_dead(tiny_model_dir: Path) -> None:
    engine = await AsyncEngine.start(engine_config(tiny_model_dir))
    core = child_of(engine)
    pid = core.pid
    assert pid is not None
    try:
        group = engine.submit([(prompt(8, 1), greedy(450))])
        async with group:
            first = await group.next_outputs(timeout=30)
            assert first and first[0].finish_reason is None
            os.kill(pid, signal.SIGKILL)
            outputs = []
            while not group.finished:
                outputs += await asyncio.wait_for(group.next_outputs(), timeout=10)
        assert outputs[-1].finish_reason is FinishReason.ERROR
        assert "engine process exited" in (outputs[-1].error or "")
        assert not engine.is_ready
        assert (core.num_running, core.num_waiting) == (0, 0)
        with pytest.raises(EngineDeadError):
            engine.submit([(prompt(8, 2), greedy(4))])
    finally:
        engine.stop()


async def test_the_child_ignores_sigint_and_stops_when_asked(tiny_model_dir: Path) -> None:
    engine = await AsyncEngine.start(engine_config(tiny_model_dir))
    pid = child_of(engine).pid
    assert pid is not None
    try:
        # A Ctrl-C reaches the whole process group; the server, not the signal, stops the engine.
        os.kill(pid, signal.SIGINT)
        (outputs,) = await run(engine.submit([(prompt(8, 3), greedy(6))]))
        assert outputs[-1].finish_reason is FinishReason.LENGTH
        assert engine.is_ready
    finally:
        await asyncio.to_thread(engine.stop)
    assert not pid_alive(pid)


def children() -> set[int]:
    return {
        int(pid)
        for task in Path(f"/proc/{os.getpid()}/task").iterdir()
        for pid in (task / "children").read_text().split()
    }


async def test_a_model_that_fails_to_load_raises_and_leaves_no_process(tmp_path: Path) -> None:
    before = children()
    with pytest.raises(EngineDeadError, match="could not load the model"):
        await AsyncEngine.start(engine_config(tmp_path / "no-such-model"))
    assert not [pid for pid in children() - before if pid_alive(pid)]


async def test_a_frozen_child_never_blocks_the_event_loop(tiny_model_dir: Path) -> None:
    """Requests go down the pipe without blocking: while the child does not read (here frozen;
    in life, busy with a long step), they queue in the server and go out when it reads again."""
    engine = await AsyncEngine.start(engine_config(tiny_model_dir))
    pid = child_of(engine).pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)
        # 200 x 400 token ids: several times the 64 KiB a pipe holds. A blocking write would stop
        # the loop here for good (the test's timeout); the loop turns, and the rest waits queued.
        groups = [engine.submit([(prompt(400, i), greedy(2))]) for i in range(200)]
        await asyncio.sleep(0.05)  # the loop sends this iteration's requests as one message
        assert child_of(engine)._outgoing  # the rest waits in the server, not in a blocked write
        os.kill(pid, signal.SIGCONT)
        results = await asyncio.wait_for(asyncio.gather(*(run(group) for group in groups)), timeout=120)
        assert all(outputs[-1].finish_reason is FinishReason.LENGTH for (outputs,) in results)
        assert not child_of(engine)._outgoing
    finally:
        os.kill(pid, signal.SIGCONT)
        engine.stop()


async def test_gpu_figures_come_from_the_engine_process(observed: tuple[AsyncEngine, RecordingObserver]) -> None:
    engine, _ = observed
    core = child_of(engine)
    assert core.gpu_stats() == []  # on the CPU the child reads none and sends none
    # What a child on CUDA sends about once a second (models/runner/gpu.py reads it there).
    core._handle(GpuReport([("cuda:0", 123_456, 80 << 30, 0.25)]))
    assert core.gpu_stats() == [("cuda:0", 123_456, 80 << 30, 0.25)]
    core._gpu_stats = []


async def test_stopping_a_frozen_child_with_a_full_pipe_does_not_hang(tiny_model_dir: Path) -> None:
    """Regression: STOP was written with a blocking write after whatever was queued; a child that
    no longer read its pipe (frozen, or stuck in a step) held shutdown forever. Now the write has
    the stop timeout, and the child is killed after it."""
    engine = await AsyncEngine.start(engine_config(tiny_model_dir))
    child = child_of(engine)
    pid = child.pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)
        for i in range(200):  # several pipes' worth, most of it queued in the server
            engine.submit([(prompt(400, i), greedy(2))])
        await asyncio.sleep(0.05)  # the loop sends this iteration's requests as one message
        assert child._outgoing
        await asyncio.to_thread(child.stop, 1.0)  # 1 s for STOP and the join, then kill and reap
        assert not pid_alive(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
