"""The shared Redis connection of the traffic layer, with fail-open health tracking.

Every traffic feature (rate limits, idempotency, dedup) keeps its shared state in Redis when
`--redis-url` is set, and falls back to its in-process state when Redis does not answer. This
module owns the one connection pool and the health flag they share:

- every call is bounded by a short timeout (plus a few turns of the event loop, see `call`), so
  a frozen or slow Redis costs a request at most that, never a hang;
- a failed call raises `RedisUnavailable` (its caller uses the fallback), and `down_after`
  consecutive failures mark Redis down (logged once, counted in `num_fallbacks`): one late reply
  under a burst is not an outage, a dead or frozen Redis is found within a few calls. While
  down, calls fail at once with `RedisUnavailable` instead of waiting on a dead socket;
- while down, one call per `probe_interval` is let through; when it succeeds Redis is up again,
  so service returns to Redis within about `probe_interval` of Redis coming back.

Retries (tenacity) happen only off the request path: at start-up `connect` waits for Redis for a
bounded number of attempts with backoff (a pod often starts beside a Redis that is starting too).
Request-path calls are never retried: their fallback is better than waiting, and a command whose
reply was lost may already have run (a token charged, a lease taken), so running it again is
not safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

log = logging.getLogger("surge.redis")

T = TypeVar("T")

# A Lua function for the scripts that keep a quota per tenant (idempotency keys, stored
# responses): KEYS[2] the tenant's sorted set of members, KEYS[3] its hash of each member's bytes
# and their `#total`. `forget(member)` drops a member from both.
LUA_FORGET_MEMBER = """
local function forget(member)
  local size = tonumber(redis.call('HGET', KEYS[3], member) or '0')
  redis.call('ZREM', KEYS[2], member)
  if size > 0 then
    redis.call('HDEL', KEYS[3], member)
    redis.call('HINCRBY', KEYS[3], '#total', -size)
  end
end
"""

# Event-loop turns given after the timeout to a reply that arrived while the loop was busy: a
# command on an open connection takes 5 turns from send to result (a new connection 19).
_GRACE_TURNS = 8


# What "Redis is not there (yet)" looks like at connect time: refused, reset, timed out.
_UNREACHABLE = (RedisError, OSError, asyncio.TimeoutError)


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no error"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class RedisUnavailable(Exception):
    """Redis did not answer in time (or is known to be down): use the in-process fallback."""


def redacted(url: str) -> str:
    """`url` without its password (`redis://user:***@host:6379/0`): what the log may show."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.hostname or ""
    netloc = f"{user}***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class RedisBackend:
    def __init__(
        self,
        url: str,
        *,
        timeout: float = 0.05,
        probe_interval: float = 0.5,
        down_after: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout <= 0:
            raise ValueError("the Redis timeout must be positive")
        if down_after < 1:
            raise ValueError("down_after (consecutive failures) must be at least 1")
        self.down_after = down_after
        self._consecutive_failures = 0
        self.url = redacted(url)  # for the log: never the password
        self.timeout = timeout
        self.probe_interval = probe_interval
        self._clock = clock
        # NOTE: no client-side retries: a retry doubles the worst-case wait, and every caller
        # has a fallback that is better than waiting.
        self._open_timeout = max(1.0, 10 * timeout)
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            # A backstop only: `call` bounds every operation; a socket timeout as short would
            # fire on the same event-loop lag that `call`'s grace turn forgives.
            socket_timeout=self._open_timeout,
            socket_connect_timeout=self._open_timeout,
            retry_on_timeout=False,
            retry=None,
            health_check_interval=0,
            # No CLIENT SETINFO on connect: two round trips less for every new pooled connection,
            # which a burst of requests opens all at once.
            lib_name=None,
            lib_version=None,
        )
        self.is_up = True
        self.num_fallbacks = 0  # up -> down transitions
        self.num_failed_calls = 0
        self._next_probe = 0.0
        self._tasks: set[asyncio.Future[None]] = set()  # pool upkeep in the background
        self._warm_size = 0  # connections `warm` opens (again after an outage)

    async def call(self, operation: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """Run one Redis operation within the timeout, or raise RedisUnavailable."""
        if not self.is_up:
            now = self._clock()
            if now < self._next_probe:
                raise RedisUnavailable("redis is down")
            self._next_probe = now + self.probe_interval  # this call is the probe
        task = asyncio.ensure_future(operation(self.client))
        try:
            done, _ = await asyncio.wait((task,), timeout=self.timeout)
            for _ in range(_GRACE_TURNS if not done else 0):
                # The timer counts event-loop time: a loop busy with a burst of arrivals wakes us
                # late, maybe after Redis answered with the reply still unread in the socket. A
                # few more turns of the loop (each polls the sockets) let it be read; a Redis that
                # is really frozen or slow still misses it, at the cost of microseconds when idle.
                await asyncio.sleep(0)
                if task.done():
                    break
            if not task.done():
                task.cancel()
                raise asyncio.TimeoutError(f"no answer from redis within {self.timeout * 1000:.0f} ms")
            result = task.result()
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            # A refused or reset connection means the pooled ones point at a dead server; a
            # timeout does not (a frozen Redis keeps them valid, and reopening them under a burst
            # costs the very event-loop turns that made the reply late).
            if self.is_up and not isinstance(exc, asyncio.TimeoutError):
                self._drop_idle_connections()
            self._failed(exc)
            raise RedisUnavailable(str(exc) or type(exc).__name__) from exc
        except asyncio.CancelledError:
            task.cancel()  # the caller went away: do not leave the command running
            raise
        self._consecutive_failures = 0
        if not self.is_up:
            self.is_up = True
            log.warning("redis at %s answers again: shared traffic state is back on Redis", self.url)
            if self._warm_size:  # the pool was emptied when Redis went down: open it again
                self._in_background(self.warm(self._warm_size))
        return result

    async def connect(
        self,
        *,
        attempts: int,
        num_connections: int,
        initial_wait: float = 0.2,
        max_wait: float = 2.0,
        attempt_timeout: float = 1.0,
    ) -> bool:
        """At start-up: wait for Redis (at most `attempts` pings, backoff between them), then open
        `num_connections` pooled connections. False when Redis never answered: the server starts
        on in-process state and the probe in `call` finds Redis when it comes."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential_jitter(initial=initial_wait, max=max_wait, jitter=initial_wait),
            retry=retry_if_exception_type(_UNREACHABLE),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await asyncio.wait_for(self.client.ping(), attempt_timeout)
        except _UNREACHABLE as exc:
            log.warning(
                "redis at %s did not answer in %d attempts (%s); starting on in-process state",
                self.url,
                attempts,
                _describe(exc),
            )
            self.num_failed_calls += 1
            self._mark_down(exc)
            self._warm_size = num_connections  # opened when the probe finds Redis again
            return False
        self.is_up = True
        await self.warm(num_connections)
        return True

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "redis at %s: attempt %d failed (%s); retrying in %.2f s",
            self.url,
            state.attempt_number,
            _describe(exc),
            wait,
        )

    async def warm(self, num_connections: int) -> None:
        """Open `num_connections` pooled connections now, so that a burst of requests finds them
        open: a new connection takes ~19 turns of the event loop, and under a burst each turn
        takes tens of ms. Best effort: a Redis that does not answer is the fallback's business.
        Done again in the background whenever Redis answers again after an outage.

        NOTE: off the request path, so not bounded by the request timeout, and a slow opening is
        no outage: 32 TLS handshakes at once (rediss://) take longer than 200 ms on 2 cores."""
        self._warm_size = num_connections
        results = await asyncio.gather(
            *(asyncio.wait_for(self.client.ping(), self._open_timeout) for _ in range(num_connections)),
            return_exceptions=True,
        )
        if all(isinstance(result, BaseException) for result in results):
            log.warning("redis at %s: none of %d new connections answered", self.url, num_connections)

    def _drop_idle_connections(self) -> None:
        """Close the pool's idle connections, in the background (the failing call does not wait).

        NOTE: they point at the Redis that just failed; after it comes back, each one would fail
        once more when next used, sending this replica back to its fallback (and counting another
        outage) for another probe interval per stale connection.
        """
        self._in_background(self._disconnect_idle())

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _disconnect_idle(self) -> None:
        try:
            await asyncio.wait_for(self.client.connection_pool.disconnect(inuse_connections=False), 1.0)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            log.debug("could not close idle Redis connections: %r", exc)

    def _failed(self, exc: BaseException) -> None:
        self.num_failed_calls += 1
        self._consecutive_failures += 1
        if not self.is_up or self._consecutive_failures >= self.down_after:
            self._mark_down(exc)

    def _mark_down(self, exc: BaseException) -> None:
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
