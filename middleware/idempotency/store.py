"""Where idempotency keys live: the store interface, its value types and the in-process store.

A key is in one of two states. *Running*: claimed by one request (its random owner token)
under a lease that the owner extends while it works; when the owner dies the lease runs out
and the key is free again. *Completed*: the stored response, kept for the TTL. Every method
is one atomic step, so two requests can never both claim a key:

- `claim` claims a free key, or reports what is there (running, completed, or a different
  request under the same key) in the same step;
- `extend`, `complete` and `release` act only for the owner of a running claim.

Two implementations: `InMemoryIdempotencyStore` here (one process, the default) and
`RedisIdempotencyStore` (middleware/idempotency/redis_store.py, shared by replicas). Knows nothing
about HTTP beyond the stored response's status, headers and body bytes.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
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
class Claim:
    state: ClaimState
    response: StoredResponse | None = None  # set when COMPLETED


class IdempotencyStore(Protocol):
    ttl_seconds: float  # how long a completed response is kept
    lease_seconds: float  # how long a running claim lives unless extended

    async def claim(self, key: str, fingerprint: str, owner: str) -> Claim: ...

    async def extend(self, key: str, owner: str) -> bool:
        """Renew the lease; False when `owner` no longer holds the key."""
        ...

    async def complete(self, key: str, owner: str, fingerprint: str, response: StoredResponse) -> bool:
        """Store the response for the TTL; False when another owner holds the key now."""
        ...

    async def release(self, key: str, owner: str) -> bool:
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


class InMemoryIdempotencyStore:
    """One process's keys in a dict, bounded in entries and bytes.

    Entries are kept in the order of their last write, so expired entries collect at the
    front and each call sweeps them off there (amortised O(1)); an expired entry found
    anywhere else is treated as absent. Past `max_entries` or `max_bytes` the oldest entries
    go first, NOTE: even before they expire: bounded memory wins over a replay, and the
    retry of an evicted key runs again.
    """

    def __init__(
        self,
        *,
        ttl_seconds: float,
        lease_seconds: float,
        max_entries: int = 100_000,
        max_bytes: int = 256 * 1024 * 1024,
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
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.num_bytes = 0  # stored response bytes

    def __len__(self) -> int:
        return len(self._entries)

    async def claim(self, key: str, fingerprint: str, owner: str) -> Claim:
        now = self._clock()
        self._sweep(now)
        entry = self._live(key, now)
        if entry is None:
            self._put(key, _Entry(fingerprint, owner, now + self.lease_seconds))
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

    async def complete(self, key: str, owner: str, fingerprint: str, response: StoredResponse) -> bool:
        now = self._clock()
        entry = self._live(key, now)
        # A lease that ran out with nobody else claiming the key: the response is still the
        # only one produced under it, so it is stored.
        if entry is not None and entry.owner != owner:
            return False
        self._put(key, _Entry(fingerprint, None, now + self.ttl_seconds, response))
        return True

    async def release(self, key: str, owner: str) -> bool:
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
        if entry.response is not None:
            self.num_bytes += entry.response.num_bytes
        self._evict_to_bounds()

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None and entry.response is not None:
            self.num_bytes -= entry.response.num_bytes

    def _sweep(self, now: float) -> None:
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.expires_at > now:
                break
            self._drop(key)

    def _evict_to_bounds(self) -> None:
        while self._entries and (len(self._entries) > self.max_entries or self.num_bytes > self.max_bytes):
            self._drop(next(iter(self._entries)))
