"""Prefix caching on the real engine: greedy tokens are the same with the cache and without it,
for every architecture (sliding windows shorter than the cached prefix included), for prompts
that share a prefix at once, for a conversation's next turn, after eviction and after an abort
in the middle of a prefill; n choices compute their prompt once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from models.config import EngineConfig, ModelConfig, SchedulerConfig
from models.engine.observer import NullObserver
from models.engine.outputs import RequestOutput
from models.process.async_engine import AsyncEngine
from models.runner import model_runner
from models.sampling.params import SamplingParams
from tests.models.engine.test_core import run, tokens as ids

BLOCK = SchedulerConfig().prefix_cache_block_size
Rounds = list[list[list[int]]]  # rounds of prompts; a round's prompts are submitted together


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 4000) for _ in range(n)]


async def start(model_dir: Path, device: str = "cpu", observer: Any = None, **scheduler: Any) -> AsyncEngine:
    scheduler.setdefault("max_model_len", 256)
    config = EngineConfig(
        ModelConfig(str(model_dir), device=device, dtype="float32"),
        SchedulerConfig(**scheduler),
        separate_process=False,
    )
    return await AsyncEngine.start(config, observer=observer) if observer else await AsyncEngine.start(config)


async def submit_round(engine: AsyncEngine, prompts: list[list[int]], max_tokens: int) -> list[list[RequestOutput]]:
    return await run(engine.submit([(p, greedy(max_tokens)) for p in prompts]))


@pytest.fixture
async def engines() -> AsyncIterator[Callable[..., Any]]:
    started: list[AsyncEngine] = []

    async def make(*args: Any, **kwargs: Any) -> AsyncEngine:
        engine = await start(*args, **kwargs)
        started.append(engine)
        return engine

    yield make
    for engine in started:
        engine.stop()


async def test_greedy_is_the_same_with_and_without_the_cache(
    arch_dir: Path, device: str, engines: Callable[..., Any]
) -> None:
    rng = random.Random(7)
    system = tokens(rng, 100)  # six blocks, longer than the 16-token sliding windows
    first = system + tokens(rng, 7)
    # The chunk budget splits the burst's prompts across steps, so cached prefixes join chunks
    # that start mid-prompt beside running decodes.
    off = await engines(arch_dir, device, prefix_caching=False, max_num_seqs=4, max_num_batched_tokens=48)
    on = await engines(arch_dir, device, max_num_seqs=4, max_num_batched_tokens=48)
    cold_off, cold_on = await submit_round(off, [first], 20), await submit_round(on, [first], 20)
    assert ids(cold_on[0]) == ids(cold_off[0]) and cold_on[0][-1].num_cached_tokens == 0
    # The next turn: the first prompt, its reply, a new user turn; and three others at once.
    turn = first + ids(cold_off[0]) + tokens(rng, 9)
    burst = [turn] + [system + tokens(rng, n) for n in (1, 30, 17)]
    warm_off, warm_on = await submit_round(off, burst, 12), await submit_round(on, burst, 12)
    assert [ids(o) for o in warm_on] == [ids(o) for o in warm_off]
    cached = [o[-1].num_cached_tokens for o in warm_on]
    # The turn reuses its whole history but the last block the reply's last token left open.
    assert cached[0] == (len(first) + 20 - 1) // BLOCK * BLOCK
    assert cached[1:] == [96, 96, 96]
    assert all(o[-1].num_cached_tokens == 0 for o in warm_off)


async def test_the_split_step_is_exact_too(
    tiny_model_dir: Path, engines: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Models whose attention has no SDPA form (softcapping) run a left-padded prefill and a
    decode per step: a cached prefix joins those chunks too."""
    monkeypatch.setattr(model_runner, "supports_packed", lambda model: False)
    rng = random.Random(9)
    system = tokens(rng, 70)
    rounds = [[system + tokens(rng, 5)], [system + tokens(rng, n) for n in (1, 12, 30)]]
    on = await engines(tiny_model_dir, max_num_seqs=4, max_num_batched_tokens=40)
    off = await engines(tiny_model_dir, prefix_caching=False, max_num_seqs=4, max_num_batched_tokens=40)
    assert not on.core.runner.packed  # type: ignore[attr-defined]
    for prompts in rounds:
        got, want = await submit_round(on, prompts, 10), await submit_round(off, prompts, 10)
        assert [ids(o) for o in got] == [ids(o) for o in want]
    assert [o[-1].num_cached_tokens for o in got] == [64, 64, 64]


async def test_a_burst_sharing_a_new_prefix_computes_it_once(tiny_model_dir: Path, engines: Callable[..., Any]) -> None:
    observer = PromptTokens()
    rng = random.Random(3)
    system = tokens(rng, 80)
    burst = [system + tokens(rng, n) for n in (3, 5, 8, 2)]
    on = await engines(tiny_model_dir, observer=observer, max_num_seqs=4)
    off = await engines(tiny_model_dir, prefix_caching=False, max_num_seqs=4)
    got, want = await submit_round(on, burst, 8), await submit_round(off, burst, 8)
    assert [ids(o) for o in got] == [ids(o) for o in want]
    # One prompt computes the shared 80 tokens; the rest wait a step and reuse them.
    assert [o[-1].num_cached_tokens for o in got] == [0, 80, 80, 80]
    assert observer.num_prompt_tokens == sum(len(p) for p in burst) - 3 * 80


async def test_n_choices_compute_their_prompt_once(tiny_model_dir: Path, engines: Callable[..., Any]) -> None:
    observer = PromptTokens()
    engine = await engines(tiny_model_dir, observer=observer, max_num_seqs=4)
    prompt = tokens(random.Random(5), 70)
    params = [SamplingParams(max_tokens=6, seed=s, ignore_eos=True) for s in range(4)]
    group = engine.submit([(prompt, p) for p in params])
    async with group:
        outputs = [out async for out in group]
    assert observer.num_prompt_tokens == 70 + 3 * (70 - 64)  # the others compute the last block alone
    assert len({tuple(out.token_ids) for out in outputs if out.token_ids}) > 1  # still sampled apart


async def test_eviction_under_a_small_pool_stays_exact(tiny_model_dir: Path, engines: Callable[..., Any]) -> None:
    rng = random.Random(11)
    prompts = [tokens(rng, 50) for _ in range(8)]  # three blocks each; the pool holds eight
    share = 8 / (4 * 256 / BLOCK)  # of max_num_seqs x max_model_len
    on = await engines(tiny_model_dir, max_num_seqs=4, prefix_cache_share=share)
    off = await engines(tiny_model_dir, prefix_caching=False, max_num_seqs=4)
    rounds = [[p] for p in prompts] + [[prompts[-1]], [prompts[0]]]
    for prompts_now in rounds:
        got, want = await submit_round(on, prompts_now, 6), await submit_round(off, prompts_now, 6)
        assert [ids(o) for o in got] == [ids(o) for o in want]
    stats = on.core.prefix_cache_stats
    assert stats.evicted_blocks > 0
    assert stats.used_bytes <= stats.capacity_bytes and stats.used_bytes > 0
    # The newest prompt survived (evicted last); the first one was evicted long ago.
    last, first = await submit_round(on, [prompts[-1] + [9]], 2), await submit_round(on, [prompts[0] + [9]], 2)
    assert last[0][-1].num_cached_tokens == 48
    assert first[0][-1].num_cached_tokens == 48  # re-kept by its own repeat in the rounds above
    rescan = await submit_round(on, [prompts[1] + [9]], 2)
    assert rescan[0][-1].num_cached_tokens == 0


async def test_an_abort_during_prefill_keeps_only_what_was_computed(
    tiny_model_dir: Path, engines: Callable[..., Any]
) -> None:
    rng = random.Random(13)
    long_prompt = tokens(rng, 200)
    # A decode runs, so the long prompt goes in 16-token chunks: many steps to abort it in.
    on = await engines(tiny_model_dir, max_num_seqs=4, max_prompt_chunk_while_decoding=16)
    off = await engines(tiny_model_dir, prefix_caching=False, max_num_seqs=4)
    blocker = on.submit([(tokens(rng, 4), greedy(200))])
    running = on.core.scheduler.running
    await wait_until(lambda: any(s.num_output_tokens for s in running))
    doomed = on.submit([(long_prompt, greedy(4))])

    def part_way() -> bool:
        return any(s.request_id == doomed.request_ids[0] and 0 < s.num_computed_tokens < 100 for s in running)

    await wait_until(part_way)
    async with doomed:
        pass  # leaving the group aborts it, mid-prompt
    async with blocker:
        pass
    got, want = await submit_round(on, [long_prompt], 10), await submit_round(off, [long_prompt], 10)
    assert ids(got[0]) == ids(want[0])
    assert 0 < got[0][-1].num_cached_tokens < 200 - BLOCK  # what the aborted prefill had computed


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


class PromptTokens(NullObserver):
    def __init__(self) -> None:
        self.num_prompt_tokens = 0

    def on_step(self, num_seqs: int, num_prompt_tokens: int, num_generated_tokens: int, seconds: float) -> None:
        self.num_prompt_tokens += num_prompt_tokens
