"""Where idempotency keys live: the store interface, its value types and the in-process store.

A key is in one of two states. *Running*: claimed by one request (its random owner token)
under a lease that the owner extends while it works; when the owner dies the lease runs out
and the key is free again. *Completed*: the stored response, kept for the TTL. Every method
is one atomic step, so two requests can never both claim a key:

- `claim` claims a free key, or reports what is there (running, completed, or a different
  request under the same key) in the same step;
- `extend`, `complete` and `release` act only for the owner of a running claim.

Every key belongs to a tenant (the API key's hash) with a quota of entries and bytes: past it the
tenant's own oldest entries go, never another tenant's, so one tenant's flood of unique keys
(cheap 4xx requests) cannot evict everyone's stored replays.

Two implementations: `InMemoryIdempotencyStore` here (one process, the default) and
`RedisIdempotencyStore` (middleware/idempotency/redis_store.py, shared by replicas). Knows nothing
about HTTP beyond the stored response's status, headers and body bytes.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class StoreUnavailable(Exception):
    """The store cannot answer now (Redis down or too slow); the caller must not run the request."""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]  # lower-case names, as ASGI sends them
    body: bytes

    @property
    def num_bytes(self) -> int:
        return len(self.body) + sum(len(name) + len(value) for name, value in self.headers)


class ClaimState(enum.Enum):
    ACQUIRED = "acquired"  # the caller owns the key now and must run the request
    RUNNING = "running"  # another request holds the key and has not finished
    COMPLETED = "completed"  # the stored response is in `Claim.response`
    MISMATCH = "mismatch"  # the key belongs to a request with a different fingerprint


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """What one tenant may keep in the store; past it, its own oldest entries are dropped."""

    max_entries: int = 10_000
    max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1:
            raise ValueError("a tenant's idempotency quota must be positive")


@dataclass(frozen=True, slots=True)
class Claim:
    state: ClaimState
    response: StoredResponse | None = None  # set when COMPLETED


class IdempotencyStore(Protocol):
    ttl_seconds: float  # how long a completed response is kept
    lease_seconds: float  # how long a running claim lives unless extended
    quota: TenantQuota  # per tenant

    async def claim(self, key: str, fingerprint: str, owner: str, tenant: str = "") -> Claim: ...

    async def extend(self, key: str, owner: str) -> bool:
        """Renew the lease; False when `owner` no longer holds the key."""
        ...

    async def complete(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, tenant: str = ""
    ) -> bool:
        """Store the response for the TTL; False when another owner holds the key now."""
        ...

    async def release(self, key: str, owner: str, tenant: str = "") -> bool:
        """Give the key up without a result, so the next request with it runs."""
        ...


def check_durations(ttl_seconds: float, lease_seconds: float) -> None:
    if ttl_seconds <= 0 or lease_seconds <= 0:
        raise ValueError("the idempotency TTL and lease must be positive")


@dataclass(slots=True)
class _Entry:
    fingerprint: str
    owner: str | None  # None once completed
    expires_at: float
    response: StoredResponse | None = None
    tenant: str = ""

    @property
    def num_bytes(self) -> int:
        return self.response.num_bytes if self.response is not None else 0


@dataclass(slots=True)
class _Tenant:
    keys: OrderedDict[str, None] = field(default_factory=OrderedDict)  # oldest write first
    num_bytes: int = 0


class InMemoryIdempotencyStore:
    """One process's keys in a dict, bounded in entries and bytes.

    Entries are kept in the order of their last write, so expired entries collect at the
    front and each call sweeps them off there (amortised O(1)); an expired entry found
    anywhere else is treated as absent. Past `max_entries` or `max_bytes` the oldest entries
    go first, and past a tenant's quota that tenant's oldest, NOTE: even before they expire:
    bounded memory wins over a replay, and the retry of an evicted key runs again.
    """

    def __init__(
        self,
        *,
        ttl_seconds: float,
        lease_seconds: float,
        max_entries: int = 100_000,
        max_bytes: int = 256 * 1024 * 1024,
        quota: TenantQuota | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_durations(ttl_seconds, lease_seconds)
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be positive")
        self.ttl_seconds = ttl_seconds
        self.lease_seconds = lease_seconds
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self.quota = quota if quota is not None else TenantQuota()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._tenants: dict[str, _Tenant] = {}
        self.num_bytes = 0  # stored response bytes

    def __len__(self) -> int:
        return len(self._entries)

    def tenant_usage(self, tenant: str) -> tuple[int, int]:
        """(entries, bytes) that `tenant` holds now."""
        held = self._tenants.get(tenant)
        return (len(held.keys), held.num_bytes) if held is not None else (0, 0)

    async def claim(self, key: str, fingerprint: str, owner: str, tenant: str = "") -> Claim:
        now = self._clock()
        self._sweep(now)
        entry = self._live(key, now)
        if entry is None:
            self._put(key, _Entry(fingerprint, owner, now + self.lease_seconds, tenant=tenant))
            return Claim(ClaimState.ACQUIRED)
        if entry.fingerprint != fingerprint:
            return Claim(ClaimState.MISMATCH)
        if entry.response is not None:
            return Claim(ClaimState.COMPLETED, entry.response)
        return Claim(ClaimState.RUNNING)

    async def extend(self, key: str, owner: str) -> bool:
        now = self._clock()
        entry = self._live(key, now)
        if entry is None or entry.owner != owner:
            return False
        entry.expires_at = now + self.lease_seconds
        self._entries.move_to_end(key)
        return True

    async def complete(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, tenant: str = ""
    ) -> bool:
        now = self._clock()
        entry = self._live(key, now)
        # A lease that ran out with nobody else claiming the key: the response is still the
        # only one produced under it, so it is stored.
        if entry is not None and entry.owner != owner:
            return False
        self._put(key, _Entry(fingerprint, None, now + self.ttl_seconds, response, tenant))
        return True

    async def release(self, key: str, owner: str, tenant: str = "") -> bool:
        entry = self._live(key, self._clock())
        if entry is None or entry.owner != owner:
            return False
        self._drop(key)
        return True

    def _live(self, key: str, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at <= now:
            self._drop(key)
            return None
        return entry

    def _put(self, key: str, entry: _Entry) -> None:
        self._drop(key)
        self._entries[key] = entry
        self.num_bytes += entry.num_bytes
        held = self._tenants.setdefault(entry.tenant, _Tenant())
        held.keys[key] = None
        held.num_bytes += entry.num_bytes
        # The tenant's own oldest first (never the entry just written), then the store's.
        while len(held.keys) > self.quota.max_entries or held.num_bytes > self.quota.max_bytes:
            oldest = next(iter(held.keys))
            if oldest == key:
                break
            self._drop(oldest)
        self._evict_to_bounds()

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self.num_bytes -= entry.num_bytes
        held = self._tenants[entry.tenant]
        del held.keys[key]
        held.num_bytes -= entry.num_bytes
        if not held.keys:
            del self._tenants[entry.tenant]

    def _sweep(self, now: float) -> None:
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.expires_at > now:
                break
            self._drop(key)

    def _evict_to_bounds(self) -> None:
        while self._entries and (len(self._entries) > self.max_entries or self.num_bytes > self.max_bytes):
            self._drop(next(iter(self._entries)))
