"""Token buckets for rate limits: the refill rule, an in-process store and a Redis store.

A bucket of capacity C (a per-minute limit) starts full, refills continuously at C / 60 per
second and never holds more than C, so a client may burst one minute's worth at once and then
proceed at the limit. One operation, `take(key, capacity, cost)`, covers every use:

- cost > 0: take `cost` if the bucket holds that much, else deny and take nothing;
- cost == 0: read the bucket (for response headers);
- cost < 0: give `-cost` back (a refund), never beyond capacity.

A full bucket is the same as no bucket, so both stores delete full buckets: memory (and Redis
keys) are bounded by the clients active in the last minute. Must not know HTTP or `app/`.

Redis mode runs each decision as one Lua script that reads Redis's own `TIME`: replicas with
skewed clocks agree, and take-or-deny is atomic, with no read-then-write from Python. When
Redis does not answer, the decision falls back to an in-process bucket holding this replica's
share of the limit (capacity / `fallback_share`); the backend returns to Redis by itself.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from middleware.redis import RedisBackend, RedisUnavailable

log = logging.getLogger("surge.rate_limit")

SECONDS_PER_MINUTE = 60.0


@dataclass(frozen=True, slots=True)
class Decision:
    is_allowed: bool
    capacity: int
    level: float  # tokens in the bucket after this decision
    retry_after: float  # seconds until the cost would fit: 0 when allowed, inf when it never will

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.level))

    @property
    def reset_after(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, self.capacity - self.level) / refill_rate(self.capacity)


class TokenBuckets(Protocol):
    async def take(self, key: str, capacity: int, cost: int) -> Decision: ...


def refill_rate(capacity: int) -> float:
    """Tokens per second: a full bucket refills from empty in one minute."""
    return capacity / SECONDS_PER_MINUTE


def decide(level: float, capacity: int, cost: int) -> tuple[bool, float, float]:
    """(is_allowed, level after, retry_after) for a bucket already refilled to `level`."""
    if cost <= 0 or level >= cost:
        return True, min(float(capacity), level - cost), 0.0
    if cost > capacity:
        return False, level, math.inf
    return False, level, (cost - level) / refill_rate(capacity)


class InProcessBuckets:
    """Buckets in a dict, for one replica (and the fallback of the Redis store)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, sweep_interval: float = 60.0) -> None:
        self._clock = clock
        self._sweep_interval = sweep_interval
        self._next_sweep = clock() + sweep_interval
        # key -> (level, updated_at, capacity); absent = full
        self._buckets: dict[str, tuple[float, float, int]] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    async def take(self, key: str, capacity: int, cost: int) -> Decision:
        return self.take_now(key, capacity, cost)

    def take_now(self, key: str, capacity: int, cost: int) -> Decision:
        if capacity <= 0:
            raise ValueError("a bucket's capacity must be positive")
        now = self._clock()
        if now >= self._next_sweep:
            self._sweep(now)
        level = self._level(key, capacity, now)
        is_allowed, level, retry_after = decide(level, capacity, cost)
        if level >= capacity:
            self._buckets.pop(key, None)
        elif is_allowed:
            self._buckets[key] = (level, now, capacity)
        return Decision(is_allowed, capacity, level, retry_after)

    def _level(self, key: str, capacity: int, now: float) -> float:
        saved = self._buckets.get(key)
        if saved is None:
            return float(capacity)
        level, updated_at, _ = saved
        return min(float(capacity), level + max(0.0, now - updated_at) * refill_rate(capacity))

    def _sweep(self, now: float) -> None:
        """Drop the buckets that have refilled: idle clients cost no memory."""
        self._next_sweep = now + self._sweep_interval
        for key, (_, _, capacity) in list(self._buckets.items()):
            if self._level(key, capacity, now) >= capacity:
                del self._buckets[key]


# One decision, atomic. KEYS[1]: the bucket (a hash of level and time); ARGV: capacity, cost.
# Mirrors `decide` above. Returns {is_allowed, level, retry_after}; floats travel as strings
# because Redis truncates Lua numbers to integers. retry_after -1 means "never" (cost > capacity).
# NOTE: the clock is Redis's TIME, never the caller's: replicas with skewed clocks agree. Since
# Redis 5 scripts replicate their effects, so reading TIME before writing is allowed.
TAKE_SCRIPT = """
local capacity = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local rate = capacity / 60
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local level = capacity
local saved = redis.call('HMGET', KEYS[1], 'level', 'at')
if saved[1] then
  local elapsed = math.max(0, now - tonumber(saved[2]))
  level = math.min(capacity, tonumber(saved[1]) + elapsed * rate)
end
local allowed = 1
local retry_after = 0
if cost <= 0 or level >= cost then
  level = math.min(capacity, level - cost)
elseif cost > capacity then
  allowed = 0
  retry_after = -1
else
  allowed = 0
  retry_after = (cost - level) / rate
end
if level >= capacity then
  redis.call('DEL', KEYS[1])
elseif allowed == 1 then
  redis.call('HSET', KEYS[1], 'level', string.format('%.17g', level), 'at', string.format('%.17g', now))
  -- Expire once refilled: a missing bucket is a full one.
  redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - level) / rate * 1000) + 1000)
end
return {allowed, string.format('%.17g', level), string.format('%.17g', retry_after)}
"""


class RedisBuckets:
    """Buckets shared by every replica through Redis; fails open to in-process buckets."""

    def __init__(
        self,
        backend: RedisBackend,
        *,
        fallback_share: int = 1,
        fallback: InProcessBuckets | None = None,
        prefix: str = "surge:ratelimit:",
    ) -> None:
        if fallback_share < 1:
            raise ValueError("fallback_share (the number of replicas) must be at least 1")
        self._backend = backend
        self._fallback_share = fallback_share
        self._fallback = fallback or InProcessBuckets()
        self.prefix = prefix
        self._script = backend.client.register_script(TAKE_SCRIPT)
        self.num_fallback_decisions = 0  # decisions made in-process because Redis did not answer

    async def take(self, key: str, capacity: int, cost: int) -> Decision:
        if capacity <= 0:
            raise ValueError("a bucket's capacity must be positive")
        try:
            raw = await self._backend.call(
                lambda client: self._script(keys=[self.prefix + key], args=[capacity, cost], client=client)
            )
        except RedisUnavailable:
            # The backend logs the outage once; each replica enforces its share meanwhile.
            self.num_fallback_decisions += 1
            return self._fallback.take_now(key, max(1, capacity // self._fallback_share), cost)
        is_allowed, level, retry_after = int(raw[0]), float(raw[1]), float(raw[2])
        return Decision(is_allowed == 1, capacity, level, math.inf if retry_after < 0 else retry_after)
