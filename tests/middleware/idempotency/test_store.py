"""The idempotency stores, in-process (with an injected clock) and in a real redis-server.

Every behaviour runs against both stores; time passes by moving the clock for the in-process
store and by sleeping for Redis, whose expiry is its own.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from middleware.idempotency.redis_store import RedisIdempotencyStore
from middleware.idempotency.store import (
    ClaimState,
    IdempotencyStore,
    InMemoryIdempotencyStore,
    StoredResponse,
    StoreUnavailable,
    TenantQuota,
)
from middleware.redis import RedisBackend

TTL = 0.4
LEASE = 0.2
RESPONSE = StoredResponse(
    200,
    ((b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store")),
    b'data: {"x": "\xc3\xa9"}\n\n\x00\xff data: [DONE]\n\n',  # any bytes survive, not just text
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Case:
    store: IdempotencyStore
    wait: Callable[[float], Awaitable[None]]  # let this much time pass


@pytest.fixture(params=["memory", "redis"])
async def case(request: pytest.FixtureRequest) -> AsyncIterator[Case]:
    if request.param == "memory":
        clock = FakeClock()

        async def advance(seconds: float) -> None:
            clock.now += seconds

        yield Case(InMemoryIdempotencyStore(ttl_seconds=TTL, lease_seconds=LEASE, clock=clock), advance)
        return
    backend = RedisBackend(request.getfixturevalue("redis_url"), timeout=1.0)
    yield Case(RedisIdempotencyStore(backend, ttl_seconds=TTL, lease_seconds=LEASE), asyncio.sleep)
    await backend.close()


async def test_first_claim_acquires_and_a_second_sees_it_running(case: Case) -> None:
    store = case.store
    assert (await store.claim("k", "fp", "owner-a")).state is ClaimState.ACQUIRED
    assert (await store.claim("k", "fp", "owner-b")).state is ClaimState.RUNNING
    assert (await store.claim("k", "other-fp", "owner-b")).state is ClaimState.MISMATCH
    assert (await store.claim("other-key", "fp", "owner-b")).state is ClaimState.ACQUIRED


async def test_completed_response_comes_back_byte_for_byte(case: Case) -> None:
    store = case.store
    await store.claim("k", "fp", "owner-a")
    assert await store.complete("k", "owner-a", "fp", RESPONSE)
    claim = await store.claim("k", "fp", "owner-b")
    assert claim.state is ClaimState.COMPLETED
    assert claim.response == RESPONSE
    assert (await store.claim("k", "other-fp", "owner-b")).state is ClaimState.MISMATCH
    # A finished key has no owner any more: nothing can extend, release or overwrite it.
    assert not await store.extend("k", "owner-a")
    assert not await store.release("k", "owner-a")
    assert not await store.complete("k", "owner-b", "fp", StoredResponse(500, (), b""))
    assert (await store.claim("k", "fp", "owner-c")).response == RESPONSE


async def test_release_frees_the_key_for_the_next_request_only_by_its_owner(case: Case) -> None:
    store = case.store
    await store.claim("k", "fp", "owner-a")
    assert not await store.release("k", "owner-b")
    assert (await store.claim("k", "fp", "owner-b")).state is ClaimState.RUNNING
    assert await store.release("k", "owner-a")
    assert (await store.claim("k", "fp", "owner-b")).state is ClaimState.ACQUIRED


async def test_a_dead_owners_lease_expires(case: Case) -> None:
    store = case.store
    await store.claim("k", "fp", "owner-a")  # ... and owner-a dies: no extend, no release
    await case.wait(LEASE / 2)
    assert (await store.claim("k", "fp", "owner-b")).state is ClaimState.RUNNING
    await case.wait(LEASE)
    assert (await store.claim("k", "fp", "owner-b")).state is ClaimState.ACQUIRED
    # The late owner can neither extend nor release the new owner's claim, nor overwrite it.
    assert not await store.extend("k", "owner-a")
    assert not await store.release("k", "owner-a")
    assert not await store.complete("k", "owner-a", "fp", RESPONSE)
    assert await store.complete("k", "owner-b", "fp", RESPONSE)


async def test_extending_keeps_a_live_owner_past_its_first_lease(case: Case) -> None:
    store = case.store
    await store.claim("k", "fp", "owner-a")
    for _ in range(4):
        await case.wait(LEASE / 2)
        assert await store.extend("k", "owner-a")
        assert not await store.extend("k", "owner-b")
    assert (await store.claim("k", "fp", "owner-b")).state is ClaimState.RUNNING


async def test_a_response_finished_after_the_lease_lapsed_is_still_stored(case: Case) -> None:
    store = case.store
    await store.claim("k", "fp", "owner-a")
    await case.wait(LEASE * 1.5)  # nobody claimed the key meanwhile
    assert await store.complete("k", "owner-a", "fp", RESPONSE)
    assert (await store.claim("k", "fp", "owner-b")).response == RESPONSE


async def test_completed_keys_expire_after_the_ttl(case: Case) -> None:
    store = case.store
    await store.claim("k", "fp", "owner-a")
    await store.complete("k", "owner-a", "fp", RESPONSE)
    await case.wait(TTL * 0.5)
    assert (await store.claim("k", "fp", "owner-b")).state is ClaimState.COMPLETED
    await case.wait(TTL * 0.75)
    assert (await store.claim("k", "fp", "owner-b")).state is ClaimState.ACQUIRED


async def test_concurrent_claims_acquire_once(case: Case) -> None:
    claims = await asyncio.gather(*(case.store.claim("k", "fp", f"owner-{i}") for i in range(50)))
    states = [claim.state for claim in claims]
    assert states.count(ClaimState.ACQUIRED) == 1
    assert states.count(ClaimState.RUNNING) == 49


@pytest.fixture(params=["memory", "redis"])
async def quota_case(request: pytest.FixtureRequest) -> AsyncIterator[IdempotencyStore]:
    quota = TenantQuota(max_entries=3, max_bytes=4 * RESPONSE.num_bytes)
    if request.param == "memory":
        yield InMemoryIdempotencyStore(ttl_seconds=60, lease_seconds=60, quota=quota)
        return
    backend = RedisBackend(request.getfixturevalue("redis_url"), timeout=1.0)
    yield RedisIdempotencyStore(backend, ttl_seconds=60, lease_seconds=60, quota=quota)
    await backend.close()


async def held(store: IdempotencyStore, key: str, tenant: str) -> bool:
    """Whether `key` is still in the store: a claim finds it, or takes it (under a tenant of its
    own, so that the probe's claim does not count against `tenant`'s quota)."""
    probe = f"probe-{tenant}"
    state = (await store.claim(key, "fp", "probe", probe)).state
    if state is ClaimState.ACQUIRED:
        await store.release(key, "probe", probe)
    return state is not ClaimState.ACQUIRED


async def test_one_tenants_flood_of_keys_evicts_only_its_own(quota_case: IdempotencyStore) -> None:
    """The finding: one pool for every tenant, so one tenant's cheap requests with unique keys
    evicted everyone's stored replays. Past its quota a tenant loses its own oldest keys."""
    store, run = quota_case, uuid.uuid4().hex  # Redis is shared with other tests
    victim, flooder = f"victim-{run}", f"flooder-{run}"
    for i in range(2):
        assert (await store.claim(f"{run}-v{i}", "fp", "o", victim)).state is ClaimState.ACQUIRED
        assert await store.complete(f"{run}-v{i}", "o", "fp", RESPONSE, victim)
    for i in range(20):
        await store.claim(f"{run}-f{i}", "fp", "o", flooder)
        await store.complete(f"{run}-f{i}", "o", "fp", RESPONSE, flooder)
    assert [await held(store, f"{run}-v{i}", victim) for i in range(2)] == [True, True]
    assert [await held(store, f"{run}-f{i}", flooder) for i in range(20)] == [False] * 17 + [True] * 3


async def test_a_tenants_stored_bytes_are_bounded_by_its_quota(quota_case: IdempotencyStore) -> None:
    store, run = quota_case, uuid.uuid4().hex
    tenant = f"t-{run}"
    big = StoredResponse(200, RESPONSE.headers, RESPONSE.body * 2)  # two of the four responses' bytes
    for i in range(3):
        await store.claim(f"{run}-{i}", "fp", "o", tenant)
        await store.complete(f"{run}-{i}", "o", "fp", big, tenant)
    assert [await held(store, f"{run}-{i}", tenant) for i in range(3)] == [False, True, True]


async def test_released_claims_do_not_count_against_the_quota(quota_case: IdempotencyStore) -> None:
    store, run = quota_case, uuid.uuid4().hex
    tenant = f"t-{run}"
    await store.claim(f"{run}-kept", "fp", "o", tenant)
    await store.complete(f"{run}-kept", "o", "fp", RESPONSE, tenant)
    for i in range(10):  # requests that failed: claimed, then released
        await store.claim(f"{run}-r{i}", "fp", "o", tenant)
        assert await store.release(f"{run}-r{i}", "o", tenant)
    assert await held(store, f"{run}-kept", tenant)


def test_memory_store_sweeps_expired_entries() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(ttl_seconds=10, lease_seconds=1, clock=clock)

    async def scenario() -> None:
        for i in range(100):
            await store.claim(f"running-{i}", "fp", "o")
        await store.claim("done", "fp", "o")
        await store.complete("done", "o", "fp", RESPONSE)
        assert len(store) == 101
        clock.now += 2  # every lease is over; the completed response is not
        await store.claim("new", "fp", "o")
        assert len(store) == 2
        assert store.num_bytes == RESPONSE.num_bytes
        clock.now += 10
        await store.claim("newer", "fp", "o")
        assert len(store) == 1 and store.num_bytes == 0

    asyncio.run(scenario())


def test_memory_store_is_bounded_in_entries_and_bytes() -> None:
    store = InMemoryIdempotencyStore(
        ttl_seconds=10, lease_seconds=1, max_entries=5, max_bytes=3 * RESPONSE.num_bytes, clock=FakeClock()
    )

    async def scenario() -> None:
        for i in range(8):
            await store.claim(f"k{i}", "fp", "o")
        assert len(store) == 5  # the oldest went first
        assert (await store.claim("k0", "fp", "o")).state is ClaimState.ACQUIRED
        for i in range(5):
            await store.claim(f"d{i}", "fp", "o")
            await store.complete(f"d{i}", "o", "fp", RESPONSE)
        assert store.num_bytes <= 3 * RESPONSE.num_bytes
        assert (await store.claim("d4", "fp", "x")).state is ClaimState.COMPLETED

    asyncio.run(scenario())


async def test_redis_store_unavailable_raises_store_unavailable() -> None:
    backend = RedisBackend("redis://127.0.0.1:1/0", timeout=0.2)  # nothing listens on port 1
    store = RedisIdempotencyStore(backend, ttl_seconds=TTL, lease_seconds=LEASE)
    with pytest.raises(StoreUnavailable):
        await store.claim("k", "fp", "owner-a")
    with pytest.raises(StoreUnavailable):
        await store.release("k", "owner-a")
    await backend.close()


@pytest.mark.parametrize(("ttl", "lease"), [(0, 1), (1, 0), (-1, 1)])
def test_durations_must_be_positive(ttl: float, lease: float) -> None:
    with pytest.raises(ValueError):
        InMemoryIdempotencyStore(ttl_seconds=ttl, lease_seconds=lease)
