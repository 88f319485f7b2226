"""Dedup cache on the real tiny engine and a real redis-server: single flight, TTL, Redis, failures.

Each test counts engine submissions by wrapping the `start` callable the routes pass in; the
engine and Redis are real.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from app.generation.collect import collect
from middleware.dedup.cache import DedupCache, request_fingerprint, wants_fresh
from middleware.dedup.flight import SharedGeneration
from middleware.dedup.store import KEY_PREFIX, LocalResults, RedisDedupStore, decode_result, encode_result
from middleware.errors import OpenAIError, service_unavailable
from middleware.redis import RedisBackend
from models.config import EngineConfig, ModelConfig, SchedulerConfig
from models.engine.outputs import MODEL_FAILED, OutputSource, RequestOutput
from models.process.async_engine import AsyncEngine, RequestGroup
from models.sampling.params import SamplingParams
from models.scheduler.sequence import FinishReason
from scripts.harness.redis_server import RedisServer

MODEL = "tiny-test"


async def start_engine(model_dir: Path) -> AsyncEngine:
    scheduler = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=512)
    return await AsyncEngine.start(
        EngineConfig(ModelConfig(str(model_dir), device="cpu", dtype="float32"), scheduler, separate_process=False)
    )


@pytest.fixture(scope="module")
async def engine(tiny_model_dir: Path) -> AsyncIterator[AsyncEngine]:
    engine = await start_engine(tiny_model_dir)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
async def engine_b(tiny_model_dir: Path) -> AsyncIterator[AsyncEngine]:
    """The second replica's engine."""
    engine = await start_engine(tiny_model_dir)
    yield engine
    engine.stop()


class Starter:
    """The `start` callable a route passes in: submits one request, counting submissions."""

    def __init__(self, engine: AsyncEngine, prompt: list[int], params: SamplingParams) -> None:
        self.engine, self.prompt, self.params = engine, prompt, params
        self.num_calls = 0

    async def __call__(self) -> RequestGroup:
        self.num_calls += 1
        return self.engine.submit([(self.prompt, self.params)])


def prompt(seed: int, n: int = 12) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 8000) for _ in range(n)]


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def key_of(p: list[int], params: SamplingParams, endpoint: str = "chat") -> str:
    key = request_fingerprint(model=MODEL, endpoint=endpoint, prompts=[p], choice_params=[params])
    assert key is not None
    return key


Delta = tuple[str, tuple[int, ...], FinishReason | None]


def deltas(outputs: list[RequestOutput]) -> list[Delta]:
    return [(o.text, tuple(o.token_ids), o.finish_reason) for o in outputs]


async def drain(handle: OutputSource) -> list[RequestOutput]:
    """Read a generation to the end the way the streaming routes do (keep-alive timeouts)."""
    outputs: list[RequestOutput] = []
    async with handle:
        while not handle.finished:
            outputs += await handle.next_outputs(0.5)
    return outputs


async def read_at_least(handle: OutputSource, num_outputs: int) -> list[RequestOutput]:
    outputs: list[RequestOutput] = []
    while len(outputs) < num_outputs:
        outputs += await handle.next_outputs(5.0)
    return outputs


async def reference(engine: AsyncEngine, p: list[int], params: SamplingParams) -> list[Delta]:
    return deltas(await drain(engine.submit([(p, params)])))


async def wait_idle(engine: AsyncEngine, *caches: DedupCache, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    core = engine.core
    while core.num_running or core.num_waiting or not all(cache.is_idle for cache in caches):
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle: running={core.num_running} caches={[c.is_idle for c in caches]}")
        await asyncio.sleep(0.01)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the fingerprint ---------------------------------------------------------------------------


def test_fingerprint_covers_everything_that_changes_the_output() -> None:
    p, base = prompt(1), greedy(16)
    key = key_of(p, base)
    assert key == key_of(list(p), greedy(16)) and len(key) == 64
    variants = [
        key_of(p, base, endpoint="completions"),
        request_fingerprint(model="other", endpoint="chat", prompts=[p], choice_params=[base]),
        key_of([*p, 5], base),
        key_of(p, greedy(17)),
        key_of(p, greedy(16, stop=("x",))),
        key_of(p, greedy(16, logit_bias={5: 1.0})),
        key_of(p, greedy(16, logprobs=0)),
        key_of(p, greedy(16, logprobs=2)),
        key_of(p, greedy(16, seed=3)),
        key_of(p, greedy(16, stop_token_ids=(9,))),
    ]
    assert len({key, *variants}) == len(variants) + 1


def test_only_determined_single_choice_requests_are_eligible() -> None:
    p = prompt(2)
    sampled_seeded = SamplingParams(max_tokens=8, temperature=0.8, seed=7)
    assert request_fingerprint(model=MODEL, endpoint="chat", prompts=[p], choice_params=[sampled_seeded]) is not None
    sampled = SamplingParams(max_tokens=8, temperature=0.8)
    assert request_fingerprint(model=MODEL, endpoint="chat", prompts=[p], choice_params=[sampled]) is None
    two_choices = [greedy(8, seed=1), greedy(8, seed=2)]
    assert request_fingerprint(model=MODEL, endpoint="chat", prompts=[p], choice_params=two_choices) is None
    two_prompts = [p, prompt(3)]
    assert (
        request_fingerprint(model=MODEL, endpoint="completions", prompts=two_prompts, choice_params=[greedy(8)]) is None
    )


async def test_cache_control_no_cache_and_a_zero_ttl_bypass() -> None:
    assert wants_fresh({"cache-control": "No-Cache"}) and wants_fresh({"cache-control": "max-age=0, no-store"})
    assert not wants_fresh({"cache-control": "max-age=60"}) and not wants_fresh({})
    request = {"model": MODEL, "endpoint": "chat", "prompts": [prompt(4)], "choice_params": [greedy(8)]}
    cache = DedupCache(ttl=300)
    assert cache.fingerprint({}, **request) is not None  # type: ignore[arg-type]
    assert cache.fingerprint({"cache-control": "no-cache"}, **request) is None  # type: ignore[arg-type]
    assert DedupCache(ttl=0).fingerprint({}, **request) is None  # type: ignore[arg-type]


def test_result_serialization_round_trips() -> None:
    from models.sampling.logprobs import TokenLogprob

    outputs = [
        RequestOutput("r", "Hé", [5, 6], 3, 2, [TokenLogprob(5, -0.5, ((5, -0.5), (7, -1.25)))] * 2),
        RequestOutput("r", "", [8], 3, 3, [TokenLogprob(8, -2.0, ())], FinishReason.LENGTH),
    ]
    for out in outputs:
        out.num_cached_tokens = 2  # as the engine reports it on every output
    decoded = decode_result(encode_result(outputs), "r")
    assert decoded == outputs
    # A result stored before the field existed replays as nothing cached.
    old = json.loads(encode_result(outputs))
    del old["num_cached_tokens"]
    assert [out.num_cached_tokens for out in decode_result(json.dumps(old).encode(), "r")] == [0, 0]


def test_local_results_expire_and_stay_within_their_bounds() -> None:
    clock = FakeClock()
    results = LocalResults(ttl=10, max_entries=2, max_tokens=5, clock=clock)

    def result(num_tokens: int) -> list[RequestOutput]:
        return [RequestOutput("r", "x", [1] * num_tokens, 1, num_tokens, [], FinishReason.STOP)]

    results.put("a", result(2))
    clock.now += 5
    results.put("b", result(2))
    results.put("c", result(2))  # over both bounds: "a" goes
    assert (results.get("a"), len(results), results.num_tokens) == (None, 2, 4)
    results.put("huge", result(6))  # larger than the whole cache: not kept
    assert results.get("huge") is None and len(results) == 2
    clock.now += 5  # "b" and "c" were stored 5 s ago
    assert results.get("b") is not None
    clock.now += 5
    assert results.get("b") is None and results.get("c") is None and results.num_tokens == 0


# --- single flight and the cache (in process) ---------------------------------------------------


async def test_identical_concurrent_requests_run_the_engine_once(engine: AsyncEngine) -> None:
    cache = DedupCache(ttl=300)
    p, params = prompt(10), greedy(48)
    start = Starter(engine, p, params)
    key = key_of(p, params)

    async def streamed() -> list[Delta]:
        return deltas(await drain(await cache.run(key, start)))

    async def collected() -> list[Delta]:
        [result] = await collect(await cache.run(key, start))
        return [("".join(result.text), tuple(result.token_ids), result.finish_reason)]

    results = await asyncio.gather(*[streamed() for _ in range(5)], *[collected() for _ in range(3)])
    assert start.num_calls == 1
    assert (cache.num_misses, cache.num_hits, cache.num_bypassed) == (1, 7, 0)
    expected = await reference(engine, p, params)
    assert all(r == expected for r in results[:5])
    joined = ("".join(d[0] for d in expected), sum((d[1] for d in expected), ()), FinishReason.LENGTH)
    assert all(r == [joined] for r in results[5:])
    await wait_idle(engine, cache)


async def test_streamed_follower_joining_mid_generation_gets_every_delta_in_order(engine: AsyncEngine) -> None:
    cache = DedupCache(ttl=300)
    p, params = prompt(11), greedy(120)
    start = Starter(engine, p, params)
    leader = await cache.run(key_of(p, params), start)
    seen = await read_at_least(leader, 10)
    follower = await cache.run(key_of(p, params), start)
    backlog = await follower.next_outputs(0)
    assert len(backlog) >= 10 and deltas(backlog[:10]) == deltas(seen[:10])  # the deltas so far, at once
    rest, leader_all = await asyncio.gather(drain(follower), drain(leader))
    assert start.num_calls == 1
    assert deltas(backlog + rest) == deltas(seen + leader_all) == await reference(engine, p, params)
    await wait_idle(engine, cache)


async def test_finished_result_is_replayed_until_the_ttl_then_recomputed(engine: AsyncEngine) -> None:
    clock = FakeClock()
    cache = DedupCache(ttl=300, clock=clock)
    p, params = prompt(12), greedy(16, seed=4)
    start = Starter(engine, p, params)
    first = deltas(await drain(await cache.run(key_of(p, params), start)))
    clock.now += 299
    replay = await cache.run(key_of(p, params), start)
    assert isinstance(replay, SharedGeneration)
    assert deltas(await drain(replay)) == first and start.num_calls == 1
    looked_up = cache.lookup(key_of(p, params))  # what degraded service may reply with
    assert looked_up is not None and deltas(await drain(looked_up)) == first
    clock.now += 2
    assert cache.lookup(key_of(p, params)) is None
    assert deltas(await drain(await cache.run(key_of(p, params), start))) == first
    assert start.num_calls == 2 and (cache.num_misses, cache.num_hits) == (2, 2)
    await wait_idle(engine, cache)


async def test_non_deterministic_requests_bypass(engine: AsyncEngine) -> None:
    cache = DedupCache(ttl=300)
    p, params = prompt(13), SamplingParams(max_tokens=8, temperature=0.9)
    start = Starter(engine, p, params)
    key = cache.fingerprint({}, model=MODEL, endpoint="chat", prompts=[p], choice_params=[params])
    assert key is None
    groups = [await cache.run(key, start) for _ in range(2)]
    assert all(isinstance(g, RequestGroup) for g in groups)  # the engine's own group, untouched
    await asyncio.gather(*[drain(g) for g in groups])
    assert start.num_calls == 2 and (cache.num_bypassed, cache.num_hits, cache.num_misses) == (2, 0, 0)
    await wait_idle(engine, cache)


async def test_leader_disconnecting_does_not_abort_followers(engine: AsyncEngine) -> None:
    cache = DedupCache(ttl=300)
    p, params = prompt(14), greedy(100)
    start = Starter(engine, p, params)
    num_aborted = engine.core.num_aborted
    leader = await cache.run(key_of(p, params), start)
    follower = await cache.run(key_of(p, params), start)
    async with leader:
        await read_at_least(leader, 3)
    # the leader's client is gone; the follower still gets the whole result
    assert deltas(await drain(follower)) == await reference(engine, p, params)
    assert start.num_calls == 1 and engine.core.num_aborted == num_aborted
    await wait_idle(engine, cache)


async def test_all_listeners_leaving_aborts_the_engine_request(engine: AsyncEngine) -> None:
    cache = DedupCache(ttl=300)
    p, params = prompt(15), greedy(300)
    start = Starter(engine, p, params)
    num_aborted = engine.core.num_aborted
    handles = [await cache.run(key_of(p, params), start) for _ in range(2)]
    await read_at_least(handles[0], 3)
    for handle in handles:
        assert isinstance(handle, SharedGeneration)
        handle.close()
    await wait_idle(engine, cache)
    assert engine.core.num_aborted == num_aborted + 1
    # nothing was cached: the next identical request generates again
    assert deltas(await drain(await cache.run(key_of(p, params), start)))[-1][2] is FinishReason.LENGTH
    assert start.num_calls == 2
    await wait_idle(engine, cache)


async def test_engine_error_reaches_every_waiter_and_is_not_cached(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = DedupCache(ttl=300)
    p, params = prompt(16), greedy(40)
    start = Starter(engine, p, params)
    runner = engine.core.runner
    real_forward = runner.forward
    calls = {"n": 0}

    def flaky_forward(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("injected forward failure")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(runner, "forward", flaky_forward)
    handles = [await cache.run(key_of(p, params), start) for _ in range(3)]
    results = await asyncio.gather(*[drain(h) for h in handles])
    for outputs in results:
        assert outputs[-1].finish_reason is FinishReason.ERROR
        assert outputs[-1].error == MODEL_FAILED
    monkeypatch.setattr(runner, "forward", real_forward)
    assert deltas(await drain(await cache.run(key_of(p, params), start)))[-1][2] is FinishReason.LENGTH
    assert start.num_calls == 2
    await wait_idle(engine, cache)


async def test_start_failure_reaches_the_caller_before_any_stream(engine: AsyncEngine) -> None:
    cache = DedupCache(ttl=300)

    async def unavailable() -> RequestGroup:
        raise service_unavailable("The engine is not available", 5.0)

    with pytest.raises(OpenAIError) as raised:
        await cache.run(key_of(prompt(17), greedy(8)), unavailable)
    assert raised.value.status_code == 503
    await wait_idle(engine, cache)


async def test_aclose_ends_every_listener_and_the_generation(engine: AsyncEngine) -> None:
    cache = DedupCache(ttl=300)
    p, params = prompt(18), greedy(300)
    start = Starter(engine, p, params)
    handles = [await cache.run(key_of(p, params), start) for _ in range(2)]
    await read_at_least(handles[0], 2)
    await cache.aclose()
    for handle in handles:
        outputs = await asyncio.wait_for(drain(handle), 5.0)
        assert outputs[-1].finish_reason is FinishReason.ERROR
    await wait_idle(engine, cache)


# --- across replicas (Redis) --------------------------------------------------------------------


@pytest.fixture
async def backends(redis_url: str) -> AsyncIterator[Callable[[], RedisBackend]]:
    made: list[RedisBackend] = []

    def make() -> RedisBackend:
        made.append(RedisBackend(redis_url, timeout=0.2))
        return made[-1]

    yield make
    for backend in made:
        await backend.close()


async def test_second_replica_waits_for_and_replays_the_first_replicas_result(
    engine: AsyncEngine, engine_b: AsyncEngine, backends: Callable[[], RedisBackend], redis_url: str
) -> None:
    replica_a = DedupCache(ttl=300, redis=backends(), poll_interval=0.02)
    replica_b = DedupCache(ttl=300, redis=backends(), poll_interval=0.02)
    p, params = prompt(20), greedy(100)
    start_a, start_b = Starter(engine, p, params), Starter(engine_b, p, params)
    key = key_of(p, params)
    on_a = await replica_a.run(key, start_a)  # takes the lock
    on_b = [await replica_b.run(key, start_b) for _ in range(2)]  # the lock is held: wait
    first_batch_b = await on_b[0].next_outputs(10.0)
    results = await asyncio.gather(drain(on_a), drain(on_b[0]), drain(on_b[1]))
    assert (start_a.num_calls, start_b.num_calls) == (1, 0)
    assert deltas(first_batch_b) == deltas(results[0])  # NOTE: other replicas get the result whole
    assert deltas([*first_batch_b, *results[1]]) == deltas(results[2]) == deltas(results[0])
    assert (replica_b.num_hits, replica_b.num_misses) == (2, 0)
    # stored with the TTL, lock released by its owner
    raw = aioredis.Redis.from_url(redis_url)
    assert 290_000 < await raw.pttl(f"{KEY_PREFIX}{{{key}}}:result") <= 300_000
    assert not await raw.exists(f"{KEY_PREFIX}{{{key}}}:lock")
    await raw.aclose()
    # a third replica replays from Redis without generating
    replica_c = DedupCache(ttl=300, redis=backends())
    assert deltas(await drain(await replica_c.run(key, start_b))) == deltas(results[0])
    assert start_b.num_calls == 0 and replica_c.num_hits == 1
    await wait_idle(engine, replica_a, replica_b, replica_c)


async def test_owner_renews_its_lease_while_it_generates(
    engine: AsyncEngine, engine_b: AsyncEngine, backends: Callable[[], RedisBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = engine.core.runner
    real_forward = runner.forward

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.008)  # in the engine thread: makes the generation outlast several leases
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(runner, "forward", slow_forward)
    # A 1 s lease renewed every third of it: short enough to need renewals, long enough that a
    # busy CI machine still renews in time.
    replica_a = DedupCache(ttl=300, redis=backends(), lease=1.0, poll_interval=0.02)
    replica_b = DedupCache(ttl=300, redis=backends(), lease=1.0, poll_interval=0.02)
    p, params = prompt(21), greedy(300)
    start_a, start_b = Starter(engine, p, params), Starter(engine_b, p, params)
    on_a = await replica_a.run(key_of(p, params), start_a)
    on_b = await replica_b.run(key_of(p, params), start_b)
    began = time.monotonic()
    a, b = await asyncio.gather(drain(on_a), drain(on_b))
    assert time.monotonic() - began > 2.0, "the generation must outlast two leases to test renewal"
    assert (start_a.num_calls, start_b.num_calls) == (1, 0) and deltas(a) == deltas(b)
    await wait_idle(engine, replica_a, replica_b)


async def test_crashed_lock_owner_costs_at_most_one_lease(
    engine_b: AsyncEngine, backends: Callable[[], RedisBackend]
) -> None:
    p, params = prompt(22), greedy(8)
    crashed = RedisDedupStore(backends(), ttl=300, lease=0.5)
    assert (await crashed.claim(key_of(p, params), "x")).token is not None  # and never released
    replica_b = DedupCache(ttl=300, redis=backends(), poll_interval=0.02)
    start_b = Starter(engine_b, p, params)
    began = time.monotonic()
    outputs = await asyncio.wait_for(drain(await replica_b.run(key_of(p, params), start_b)), 10.0)
    waited = time.monotonic() - began
    assert outputs[-1].finish_reason is FinishReason.LENGTH and start_b.num_calls == 1
    assert 0.3 < waited < 0.5 + 1.0
    await wait_idle(engine_b, replica_b)


async def test_only_the_owner_releases_the_lock(backends: Callable[[], RedisBackend]) -> None:
    store = RedisDedupStore(backends(), ttl=300, lease=30)
    key = key_of(prompt(23), greedy(8))
    token = (await store.claim(key, "x")).token
    assert token is not None
    assert not await store.release(key, "someone-else")
    assert (await store.claim(key, "x")).is_held_elsewhere
    assert await store.release(key, token)
    assert (await store.claim(key, "x")).token is not None


async def test_redis_killed_requests_are_computed_locally_and_nothing_hangs(engine_b: AsyncEngine) -> None:
    with RedisServer() as server:
        backend = RedisBackend(server.url, timeout=0.1)
        p, params = prompt(24), greedy(8)
        crashed = RedisDedupStore(backend, ttl=300, lease=30)
        assert (await crashed.claim(key_of(p, params), "x")).token is not None  # held for 30 s
        replica = DedupCache(ttl=300, redis=backend, poll_interval=0.02)
        start = Starter(engine_b, p, params)
        waiting = await replica.run(key_of(p, params), start)  # a follower, polling Redis
        await asyncio.sleep(0.2)
        server.kill()
        outputs = await asyncio.wait_for(drain(waiting), 10.0)
        assert start.num_calls == 1  # the follower gave up on Redis and computed it here
        assert outputs[-1].finish_reason is FinishReason.LENGTH
        # Redis still down: a new request is computed locally at once; identical ones still share
        q = prompt(25)
        start_q = Starter(engine_b, q, params)
        handles = [await asyncio.wait_for(replica.run(key_of(q, params), start_q), 2.0) for _ in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*[drain(h) for h in handles]), 10.0)
        assert start_q.num_calls == 1 and all(deltas(r) == deltas(results[0]) for r in results)
        await wait_idle(engine_b, replica)
        await backend.close()


def test_the_fingerprint_keeps_its_canonical_form_across_versions() -> None:
    """Replicas share keys through Redis, so one running the next version must compute the same
    key: the sha256 of this JSON (the fields are now read without `asdict`'s deep copy)."""
    p, params = prompt(4), greedy(16, stop=("x", "y"), logit_bias={5: 1.5, 2: -3.0}, seed=11)
    canonical = {"v": 1, "model": MODEL, "endpoint": "chat", "prompt": list(p), "params": dataclasses.asdict(params)}
    expected = hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert request_fingerprint(model=MODEL, endpoint="chat", prompts=[p], choice_params=[params]) == expected


def test_the_tenant_is_part_of_the_key() -> None:
    p, params = prompt(7), greedy(8)

    def keyed(tenant: str) -> str | None:
        return request_fingerprint(model=MODEL, endpoint="chat", prompts=[p], choice_params=[params], tenant=tenant)

    assert keyed("") == key_of(p, params)  # no tenant: the keys the cache always had
    assert len({keyed(""), keyed("sk-a"), keyed("sk-b")}) == 3
