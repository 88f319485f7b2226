"""Token buckets: refill math on an injected clock, and the Lua script against a real Redis."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator

import pytest
import redis

from middleware.rate_limit.buckets import InProcessBuckets, RedisBuckets
from middleware.redis import RedisBackend
from scripts.harness.redis_server import RedisServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- in-process -------------------------------------------------------------------------------


def test_a_full_bucket_admits_one_minute_then_refills_at_limit_per_60s() -> None:
    clock = Clock()
    buckets = InProcessBuckets(clock=clock)
    assert [buckets.take_now("k", 60, 1).is_allowed for _ in range(61)] == [True] * 60 + [False]
    denied = buckets.take_now("k", 60, 1)
    assert denied.remaining == 0 and denied.retry_after == pytest.approx(1.0)  # 60/min = 1/s
    clock.now += 0.5
    half = buckets.take_now("k", 60, 1)
    assert not half.is_allowed and half.retry_after == pytest.approx(0.5) and half.level == pytest.approx(0.5)
    clock.now += 0.5
    assert buckets.take_now("k", 60, 1).is_allowed
    clock.now += 30
    assert buckets.take_now("k", 60, 0).remaining == 30
    clock.now += 1000  # never beyond capacity
    assert buckets.take_now("k", 60, 0).level == 60


def test_a_denied_take_takes_nothing_and_reports_when_it_would_fit() -> None:
    clock = Clock()
    buckets = InProcessBuckets(clock=clock)
    assert buckets.take_now("k", 600, 550).is_allowed  # 10 tokens/s
    denied = buckets.take_now("k", 600, 100)
    assert not denied.is_allowed
    assert denied.level == 50 and denied.retry_after == pytest.approx(5.0)
    assert denied.reset_after == pytest.approx(55.0)
    clock.now += 5
    assert buckets.take_now("k", 600, 100).is_allowed


def test_refunds_give_tokens_back_up_to_capacity() -> None:
    clock = Clock()
    buckets = InProcessBuckets(clock=clock)
    buckets.take_now("k", 100, 80)
    assert buckets.take_now("k", 100, -30).level == 50
    assert buckets.take_now("k", 100, -500).level == 100
    assert len(buckets) == 0  # a full bucket is no bucket


def test_a_cost_above_capacity_never_fits() -> None:
    decision = InProcessBuckets(clock=Clock()).take_now("k", 100, 101)
    assert not decision.is_allowed and math.isinf(decision.retry_after) and decision.level == 100


def test_buckets_are_per_key() -> None:
    buckets = InProcessBuckets(clock=Clock())
    assert buckets.take_now("a", 1, 1).is_allowed
    assert not buckets.take_now("a", 1, 1).is_allowed
    assert buckets.take_now("b", 1, 1).is_allowed


def test_idle_buckets_are_dropped_once_refilled() -> None:
    clock = Clock()
    buckets = InProcessBuckets(clock=clock, sweep_interval=60)
    for i in range(1000):
        buckets.take_now(f"client-{i}", 60, 1)
    assert len(buckets) == 1000
    clock.now += 61  # every bucket has refilled
    buckets.take_now("late", 60, 1)
    assert len(buckets) == 1


# --- Redis ------------------------------------------------------------------------------------


@pytest.fixture
async def backend(redis_url: str) -> AsyncIterator[RedisBackend]:
    backend = RedisBackend(redis_url, timeout=1.0)
    yield backend
    await backend.close()


async def test_redis_admits_exactly_the_capacity_then_denies(backend: RedisBackend, redis_url: str) -> None:
    buckets = RedisBuckets(backend)
    decisions = [await buckets.take("k", 10, 1) for _ in range(11)]
    assert [d.is_allowed for d in decisions] == [True] * 10 + [False]
    assert [d.remaining for d in decisions[:10]] == list(range(9, -1, -1))
    assert 5.9 < decisions[-1].retry_after <= 6.0  # 10/min: one token every 6 s
    client = redis.Redis.from_url(redis_url)
    # The bucket expires once it would be full again (60 s from empty) plus a second.
    assert 59_000 < client.pttl("surge:ratelimit:k") <= 61_000
    assert set(client.hkeys("surge:ratelimit:k")) == {b"level", b"at"}
    assert buckets.num_fallback_decisions == 0


async def test_redis_refunds_and_deletes_full_buckets(backend: RedisBackend, redis_url: str) -> None:
    buckets = RedisBuckets(backend)
    client = redis.Redis.from_url(redis_url)
    assert (await buckets.take("k", 600, 500)).remaining == 100
    assert (await buckets.take("k", 600, -200)).remaining == 300
    assert not (await buckets.take("k", 600, 400)).is_allowed
    assert (await buckets.take("k", 600, 0)).remaining == 300  # a read changes nothing
    assert client.exists("surge:ratelimit:k")
    assert (await buckets.take("k", 600, -10_000)).level == 600
    assert not client.exists("surge:ratelimit:k")  # full: nothing stored
    too_large = await buckets.take("k", 600, 601)
    assert not too_large.is_allowed and math.isinf(too_large.retry_after)


async def test_two_replicas_sharing_redis_never_admit_more_than_capacity_plus_refill(redis_url: str) -> None:
    capacity = 300  # refills 5 per second
    replicas = [RedisBackend(redis_url, timeout=1.0) for _ in range(2)]
    admitted = 0

    async def hammer(buckets: RedisBuckets, until: float) -> None:
        nonlocal admitted
        while time.monotonic() < until:
            if (await buckets.take("shared", capacity, 1)).is_allowed:
                admitted += 1

    try:
        start = time.monotonic()
        until = start + 1.0
        await asyncio.gather(
            *(hammer(RedisBuckets(backend), until) for backend in replicas for _ in range(4))  # 4 clients each
        )
        elapsed = time.monotonic() - start
    finally:
        for backend in replicas:
            await backend.close()
    assert capacity <= admitted <= capacity + math.ceil(elapsed * capacity / 60)


async def test_redis_unreachable_falls_back_to_this_replicas_share() -> None:
    with RedisServer() as server:
        # A clock that stands still: no probe interval ends, so every call after the first failure
        # fails at once without touching the dead server.
        backend = RedisBackend(server.url, timeout=0.05, clock=lambda: 0.0)
        buckets = RedisBuckets(backend, fallback_share=3)
        assert (await buckets.take("k", 30, 1)).capacity == 30
        server.kill()
        decisions = [await buckets.take("k", 30, 1) for _ in range(11)]
        # `down_after` calls met the dead server (refused at once); none of the rest touched it
        assert backend.num_failed_calls == backend.down_after
        assert [d.is_allowed for d in decisions] == [True] * 10 + [False]  # 30 / 3 replicas
        assert {d.capacity for d in decisions} == {10}
        assert buckets.num_fallback_decisions == 11 and backend.num_fallbacks == 1
        await backend.close()
