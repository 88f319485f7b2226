"""The shared Redis connection of the traffic layer, with fail-open health tracking.

Every traffic feature (rate limits, idempotency, dedup) keeps its shared state in Redis when
`--redis-url` is set, and falls back to its in-process state when Redis does not answer. This
module owns the one connection pool and the health flag they share:

- every call is bounded by a short timeout, so a frozen or slow Redis costs a request at most
  that timeout, never a hang;
- the first failure marks Redis down (logged once, counted in `num_fallbacks`); while down,
  calls fail at once with `RedisUnavailable` instead of waiting on a dead socket;
- while down, one call per `probe_interval` is let through; when it succeeds Redis is up again,
  so service returns to Redis within about `probe_interval` of Redis coming back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger("surge.redis")

T = TypeVar("T")


class RedisUnavailable(Exception):
    """Redis did not answer in time (or is known to be down): use the in-process fallback."""


class RedisBackend:
    def __init__(
        self,
        url: str,
        *,
        timeout: float = 0.05,
        probe_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout <= 0:
            raise ValueError("the Redis timeout must be positive")
        self.url = url
        self.timeout = timeout
        self.probe_interval = probe_interval
        self._clock = clock
        # NOTE: no client-side retries: a retry doubles the worst-case wait, and every caller
        # has a fallback that is better than waiting.
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry_on_timeout=False,
            retry=None,
            health_check_interval=0,
        )
        self.is_up = True
        self.num_fallbacks = 0  # up -> down transitions
        self.num_failed_calls = 0
        self._next_probe = 0.0

    async def call(self, operation: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """Run one Redis operation within the timeout, or raise RedisUnavailable."""
        if not self.is_up:
            now = self._clock()
            if now < self._next_probe:
                raise RedisUnavailable("redis is down")
            self._next_probe = now + self.probe_interval  # this call is the probe
        try:
            result = await asyncio.wait_for(operation(self.client), self.timeout)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            self._mark_down(exc)
            raise RedisUnavailable(str(exc) or type(exc).__name__) from exc
        if not self.is_up:
            self.is_up = True
            log.warning("redis at %s answers again: shared traffic state is back on Redis", self.url)
        return result

    def _mark_down(self, exc: BaseException) -> None:
        self.num_failed_calls += 1
        if self.is_up:
            self.is_up = False
            self.num_fallbacks += 1
            self._next_probe = self._clock() + self.probe_interval
            log.error(
                "redis at %s failed (%s): failing open to in-process state until it answers again",
                self.url,
                type(exc).__name__,
            )

    async def close(self) -> None:
        await self.client.aclose()
