"""Engine tests on the real tiny model: batching, joining, leaving, aborts, failures."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from models.config import EngineConfig, ModelConfig, SchedulerConfig
from models.engine.outputs import MODEL_FAILED, RequestOutput
from models.kv.events import KvEvent
from models.process.async_engine import AsyncEngine, RequestGroup
from models.sampling.params import SamplingParams
from models.scheduler.sequence import FinishReason

EngineFactory = Callable[..., Any]


@pytest.fixture
async def make_engine(tiny_model_dir: Path) -> AsyncIterator[EngineFactory]:
    engines: list[AsyncEngine] = []

    async def make(**scheduler: int) -> AsyncEngine:
        scheduler.setdefault("max_model_len", 512)
        config = EngineConfig(
            ModelConfig(str(tiny_model_dir), device="cpu", dtype="float32"),
            SchedulerConfig(**scheduler),
            separate_process=False,
        )
        engine = await AsyncEngine.start(config)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 8000) for _ in range(n)]


async def run(group: RequestGroup) -> list[list[RequestOutput]]:
    outputs: list[list[RequestOutput]] = [[] for _ in group.request_ids]
    async with group:
        async for out in group:
            outputs[group.index[out.request_id]].append(out)
    return outputs


def tokens(outputs: list[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def test_greedy_batched_with_seven_others_equals_alone(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=8, max_num_batched_tokens=64)
    prompts = [prompt(n, seed=i) for i, n in enumerate([5, 49, 17, 3, 30, 11, 40, 23])]
    lengths = [20, 7, 33, 12, 25, 9, 30, 16]
    alone = []
    for p, n in zip(prompts, lengths, strict=True):
        alone.append(tokens((await run(engine.submit([(p, greedy(n))])))[0]))

    # Staggered: requests join at different steps and leave at different steps.
    async def delayed(i: int) -> list[int]:
        await asyncio.sleep(0.003 * i)
        return tokens((await run(engine.submit([(prompts[i], greedy(lengths[i]))])))[0])

    batched = await asyncio.gather(*(delayed(i) for i in range(8)))
    assert batched == alone
    assert [len(t) for t in batched] == lengths


async def test_short_request_finishes_before_long_one(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=4)
    finished: list[str] = []

    async def go(name: str, max_tokens: int, delay: float) -> None:
        await asyncio.sleep(delay)
        await run(engine.submit([(prompt(8, 1), greedy(max_tokens))]))
        finished.append(name)

    await asyncio.gather(go("long", 200, 0.0), go("short", 5, 0.05))
    assert finished == ["short", "long"]


async def test_abort_frees_the_slot_and_queue_place(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=1)
    running = engine.submit([(prompt(8, 2), greedy(400))])
    waiting = engine.submit([(prompt(8, 3), greedy(400))])
    first = await running.next_outputs(5.0)
    assert first, "the running request produced nothing"
    await wait_until(lambda: engine.core.num_waiting == 1)
    waiting.close()  # aborted while still queued
    await wait_until(lambda: engine.core.num_waiting == 0)
    running.close()  # aborted mid-generation
    await wait_until(lambda: engine.core.num_running == 0)
    # The freed slot serves the next request normally.
    out = await run(engine.submit([(prompt(8, 4), greedy(3))]))
    assert len(tokens(out[0])) == 3
    assert engine.core._requests == {}


async def test_same_seed_same_text_alone_and_batched(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=8)
    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    p = prompt(12, 5)
    first = tokens((await run(engine.submit([(p, params)])))[0])
    noise = [engine.submit([(prompt(10, 100 + i), SamplingParams(max_tokens=30, seed=None))]) for i in range(5)]
    second = tokens((await run(engine.submit([(p, params)])))[0])
    for group in noise:
        await run(group)
    assert first == second
    other = tokens((await run(engine.submit([(p, SamplingParams(max_tokens=24, seed=99, ignore_eos=True))])))[0])
    assert other != first


async def test_long_prompt_is_chunked_while_streams_keep_moving(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=1024)
    stream = engine.submit([(prompt(4, 6), greedy(300))])
    await stream.next_outputs(5.0)
    steps_before = engine.core.num_steps
    long = engine.submit([(prompt(400, 7), greedy(1))])
    tokens_during: list[int] = []
    async with long, stream:
        long_done = asyncio.ensure_future(run(long))
        while not long_done.done():
            for out in await stream.next_outputs(1.0):
                tokens_during += out.token_ids
        await long_done
    # 400 prompt tokens at <= 31 per step (one row decodes) take >= 13 steps, each with a decode.
    assert engine.core.num_steps - steps_before >= 13
    assert len(tokens_during) >= 12


async def test_priority_orders_the_queue_fifo_within_a_level(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=1)
    blocker = engine.submit([(prompt(4, 8), greedy(450))])
    await blocker.next_outputs(5.0)
    order: list[str] = []

    async def go(name: str, priority: int) -> None:
        await run(engine.submit([(prompt(4, 9), greedy(2))], priority=priority))
        order.append(name)

    tasks = []
    for name, priority in [("low-1", 5), ("high-1", -1), ("low-2", 5), ("mid", 0), ("high-2", -1)]:
        tasks.append(asyncio.ensure_future(go(name, priority)))
        await asyncio.sleep(0.01)  # arrival order is the tie-breaker
    await wait_until(lambda: engine.core.num_waiting == 5)
    assert not blocker.finished
    blocker.close()
    await asyncio.gather(*tasks)
    assert order == ["high-1", "high-2", "mid", "low-1", "low-2"]


async def test_stop_string_ends_the_sequence_and_is_not_emitted(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    p = prompt(6, 10)
    full = "".join(o.text for o in (await run(engine.submit([(p, greedy(40))])))[0])
    stop = full[10:13]
    assert stop and stop in full
    outputs = (await run(engine.submit([(p, greedy(40, stop=(stop,)))])))[0]
    text = "".join(o.text for o in outputs)
    assert text == full[: full.index(stop)]
    assert outputs[-1].finish_reason is FinishReason.STOP
    assert outputs[-1].stop_reason == stop  # named, as vLLM's stop_reason: the one that matched
    assert all(o.stop_reason is None for o in outputs[:-1])


async def test_a_stop_token_is_named_and_a_length_finish_names_nothing(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    p = prompt(6, 11)
    ids = [t for o in (await run(engine.submit([(p, greedy(12))])))[0] for t in o.token_ids]
    outputs = (await run(engine.submit([(p, greedy(12, stop_token_ids=(ids[5],)))])))[0]
    assert outputs[-1].finish_reason is FinishReason.STOP and outputs[-1].stop_reason == ids[5]
    assert len(tokens(outputs)) == ids.index(ids[5]) + 1
    cut = (await run(engine.submit([(p, greedy(3))])))[0]
    assert cut[-1].finish_reason is FinishReason.LENGTH and cut[-1].stop_reason is None


async def test_forward_failure_fails_the_batch_and_the_loop_lives_on(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await make_engine()
    runner = engine.core.runner
    real_forward = runner.forward
    calls = {"n": 0}

    def flaky_forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected forward failure")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(runner, "forward", flaky_forward)
    groups = [engine.submit([(prompt(5, 20 + i), greedy(10))]) for i in range(3)]
    results = [await run(g) for g in groups]
    failed = [r[0][-1] for r in results if r[0][-1].finish_reason is FinishReason.ERROR]
    # The exception's text stays in the log; the requests get the engine's sentence.
    assert failed and all(o.error == MODEL_FAILED for o in failed)
    assert engine.is_ready
    after = await run(engine.submit([(prompt(5, 30), greedy(4))]))
    assert len(tokens(after[0])) == 4
    await wait_until(lambda: engine.core.num_running == 0)


async def test_dead_loop_turns_not_ready_and_every_waiter_hears(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await make_engine(max_num_seqs=1)
    running = engine.submit([(prompt(5, 40), greedy(300))])
    waiting = engine.submit([(prompt(5, 41), greedy(5))])
    await running.next_outputs(5.0)

    def broken_postprocess(*args: Any, **kwargs: Any) -> list[RequestOutput]:
        raise SystemError("injected engine bug")

    monkeypatch.setattr(engine.core, "_postprocess", broken_postprocess)
    for group in (running, waiting):
        outputs = await asyncio.wait_for(run(group), 10.0)
        assert outputs[0][-1].finish_reason is FinishReason.ERROR
    await wait_until(lambda: not engine.is_ready)
    with pytest.raises(RuntimeError):
        engine.submit([(prompt(5, 42), greedy(5))])


async def test_n_choices_share_a_prompt_and_differ(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    params = [SamplingParams(max_tokens=12, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    outputs = await run(engine.submit([(prompt(7, 50), p) for p in params]))
    texts = [tokens(o) for o in outputs]
    assert all(len(t) == 12 for t in texts)
    assert len({tuple(t) for t in texts}) == 3


async def test_request_past_its_queue_deadline_is_dropped_without_the_model(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=1, max_queue_seconds=0.2)
    blocker = engine.submit([(prompt(4, 60), greedy(450))])
    await blocker.next_outputs(5.0)
    steps_before = engine.core.num_steps
    late = await asyncio.wait_for(run(engine.submit([(prompt(4, 61), greedy(5))])), 5.0)
    (output,) = late[0]
    assert output.finish_reason is FinishReason.REJECTED
    assert output.num_output_tokens == 0 and output.token_ids == []
    assert "queue" in (output.error or "")
    assert engine.core.num_steps > steps_before  # the blocker kept running meanwhile
    blocker.close()
    await wait_until(lambda: engine.core.num_running == 0 and engine.core.num_waiting == 0)


async def test_load_snapshot_reports_queue_and_latency(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=1)
    idle = engine.load_snapshot()
    assert (idle.num_waiting, idle.num_running, idle.queue_time_p90, idle.ttft_p90) == (0, 0, 0.0, 0.0)
    blocker = engine.submit([(prompt(4, 70), greedy(400))])
    await blocker.next_outputs(5.0)
    waiting = [engine.submit([(prompt(30, 71 + i), greedy(2))]) for i in range(3)]
    await wait_until(lambda: engine.load_snapshot().num_waiting_tokens == 90)
    busy = engine.load_snapshot()
    assert busy.num_running == 1 and busy.num_waiting_tokens == 90 and busy.kv_usage > 0
    await asyncio.sleep(0.1)
    blocker.close()
    for group in waiting:
        await run(group)
    after = engine.load_snapshot()
    assert after.queue_time_p90 >= 0.05  # the three waited behind the blocker for 0.1 s (fading since)
    assert after.ttft_p90 >= after.queue_time_p90
    assert after.error_rate == 0.0
    stats = engine.load.stats  # one sample per request: the blocker (aborted: no finish) and three
    assert [len(stats._queue_times[0]), len(stats._ttfts[0]), len(stats._finishes[0])] == [4, 4, 3]
    fan_out = engine.submit([(prompt(8, 90 + i), greedy(2)) for i in range(6)])  # one request, six sequences
    await run(fan_out)
    assert [len(stats._queue_times[0]), len(stats._ttfts[0]), len(stats._finishes[0])] == [5, 5, 4]


class RecordingObserver:
    def __init__(self) -> None:
        self.num_seqs: list[int] = []
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.queue_times: list[float] = []
        self.ttfts: list[float] = []
        self.gaps: list[float] = []
        self.finishes: list[FinishReason] = []
        self.mask_seconds: list[float] = []
        self.compile_seconds: list[float] = []
        self.kv_events: list[KvEvent] = []

    def on_step(self, num_seqs: int, num_prompt_tokens: int, num_generated_tokens: int, seconds: float) -> None:
        self.num_seqs.append(num_seqs)
        self.num_prompt_tokens += num_prompt_tokens
        self.num_generated_tokens += num_generated_tokens

    def on_admitted(self, queue_time: float) -> None:
        self.queue_times.append(queue_time)

    def on_first_token(self, ttft: float) -> None:
        self.ttfts.append(ttft)

    def on_token_gaps(self, gaps: list[float]) -> None:
        self.gaps += gaps

    def on_finish(self, reason: FinishReason, e2e: float) -> None:
        self.finishes.append(reason)

    def on_grammar_masks(self, seconds: float) -> None:
        self.mask_seconds.append(seconds)

    def on_grammar_compiled(self, seconds: float) -> None:
        self.compile_seconds.append(seconds)

    def on_kv_events(self, events: list[KvEvent]) -> None:
        self.kv_events += events


async def test_observer_sees_steps_tokens_and_finishes_but_not_warmup(tiny_model_dir: Path) -> None:
    observer = RecordingObserver()
    config = EngineConfig(
        ModelConfig(str(tiny_model_dir), device="cpu", dtype="float32"),
        SchedulerConfig(max_model_len=512),
        separate_process=False,
    )
    engine = await AsyncEngine.start(config, observer=observer)
    try:
        assert not observer.num_seqs  # warmup is not load
        await run(engine.submit([(prompt(10, 80), greedy(5)), (prompt(12, 81), greedy(3))]))
        assert engine.core.kv_usage == 0.0  # back to idle, although no step follows the last finish
    finally:
        engine.stop()
    assert (observer.num_prompt_tokens, observer.num_generated_tokens) == (22, 8)
    assert len(observer.queue_times) == len(observer.ttfts) == 2
    assert len(observer.gaps) == 4 + 2 and all(gap > 0 for gap in observer.gaps)
    assert observer.finishes == [FinishReason.LENGTH, FinishReason.LENGTH]
    assert max(observer.num_seqs) == 2


class ChunkSizes(RecordingObserver):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[int, int]] = []  # (sequences, prompt tokens) per step

    def on_step(self, num_seqs: int, num_prompt_tokens: int, num_generated_tokens: int, seconds: float) -> None:
        super().on_step(num_seqs, num_prompt_tokens, num_generated_tokens, seconds)
        self.steps.append((num_seqs, num_prompt_tokens))


@pytest.mark.parametrize(("target_seconds", "chunks"), [(0.0, [128, 128, 128, 16]), (1e-9, [64] * 6 + [16])])
async def test_the_engine_paces_a_long_prompt_by_its_measured_step_times(
    tiny_model_dir: Path, target_seconds: float, chunks: list[int]
) -> None:
    """The engine hands the scheduler each step's seconds: with a target no step can meet, a long
    prompt beside a decoding stream goes in the pacer's smallest chunks; with none, in the token cap's."""
    observer = ChunkSizes()
    scheduler = SchedulerConfig(
        max_num_seqs=2,
        max_model_len=1024,
        max_prompt_chunk_while_decoding=128,
        max_prompt_chunk_seconds_while_decoding=target_seconds,
    )
    model = ModelConfig(str(tiny_model_dir), device="cpu", dtype="float32")
    config = EngineConfig(model, scheduler, separate_process=False)
    engine = await AsyncEngine.start(config, observer=observer)
    try:
        blocker = engine.submit([(prompt(4, 90), greedy(600))])
        await wait_until(lambda: observer.num_generated_tokens > 1)
        await run(engine.submit([(prompt(400, 91), greedy(1))]))
        await run(blocker)
    finally:
        engine.stop()
    assert [tokens for num_seqs, tokens in observer.steps if num_seqs == 2] == chunks
