"""Failed authentications, throttled per client address: guessing keys costs the guesser time.

Each address has a token bucket of failed attempts (`per_minute`, refilled continuously, bursts up
to the same number). An attempt with a missing or wrong key takes one; with none left, the answer
is a 429 with Retry-After instead of the 401. Valid keys are never throttled, so a client that has
a key is never slowed by someone else's guessing from the same address (an ingress's, say).
Memory is bounded: the least recently seen addresses are forgotten first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# Addresses remembered at once; a forgotten address starts again with a full bucket.
MAX_ADDRESSES = 10_000


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class AuthFailures:
    """Shared by the auth middleware (which counts) and the metrics (which read the counters)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        """per_minute: failed attempts an address may make per minute; 0 = no throttling."""
        if per_minute < 0:
            raise ValueError("per_minute must be 0 (off) or positive")
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self.num_rejected = 0  # 401s
        self.num_throttled = 0  # 429s

    def allows_attempt(self, address: str) -> bool:
        """Whether `address` may have its key checked now (it has failed attempts left)."""
        if not self.per_minute:
            return True
        bucket = self._refilled(address)
        if bucket is None or bucket.tokens >= 1:
            return True
        self.num_throttled += 1
        return False

    def failed(self, address: str) -> None:
        """An attempt from `address` had a missing or wrong key."""
        self.num_rejected += 1
        if not self.per_minute:
            return
        bucket = self._refilled(address)
        if bucket is None:
            bucket = self._buckets[address] = _Bucket(float(self.per_minute), self._clock())
            while len(self._buckets) > MAX_ADDRESSES:
                self._buckets.popitem(last=False)
        bucket.tokens = max(0.0, bucket.tokens - 1)

    def retry_after(self, address: str) -> float:
        """Seconds until `address` has an attempt again."""
        bucket = self._refilled(address)
        if bucket is None or bucket.tokens >= 1:
            return 0.0
        return (1 - bucket.tokens) * 60.0 / self.per_minute

    def _refilled(self, address: str) -> _Bucket | None:
        bucket = self._buckets.get(address)
        if bucket is None:
            return None
        now = self._clock()
        bucket.tokens = min(float(self.per_minute), bucket.tokens + (now - bucket.updated) * self.per_minute / 60.0)
        bucket.updated = now
        self._buckets.move_to_end(address)
        return bucket
