"""The shared Redis connection's timeouts against a real redis-server: what counts as Redis not
answering, and what is only the event loop being busy."""

from __future__ import annotations

import asyncio
import time

import pytest

from middleware.redis_backend import RedisBackend, RedisUnavailable
from tests.redis_server import RedisServer


async def test_a_busy_event_loop_is_not_a_redis_timeout(redis_url: str) -> None:
    """Regression: under a burst of arrivals every turn of the event loop takes tens of ms, and a
    command (5 turns from send to result on an open connection, 19 on a new one) outlasted the
    timeout though Redis answered at once: it failed, marked Redis down, and idempotent requests
    got 503s. Now the pool is opened at start-up and a late reply gets a few more turns."""
    backend = RedisBackend(redis_url, timeout=0.05)
    loop = asyncio.get_running_loop()
    busy = True

    def burst_turn() -> None:  # each turn of the loop also handles requests: 20 ms of work
        time.sleep(0.02)
        if busy:
            loop.call_soon(burst_turn)

    try:
        await backend.warm(8)  # as the server does at start-up
        loop.call_soon(burst_turn)
        results = await asyncio.gather(*(backend.call(lambda r, i=i: r.set(f"k{i}", i)) for i in range(8)))
        assert results == [True] * 8
        assert backend.is_up and backend.num_failed_calls == 0
    finally:
        busy = False
        await backend.close()


async def test_a_frozen_redis_is_still_a_timeout_bounded_by_it() -> None:
    with RedisServer() as redis:
        backend = RedisBackend(redis.url, timeout=0.05)
        try:
            await backend.call(lambda r: r.ping())
            redis.freeze()
            started = time.monotonic()
            with pytest.raises(RedisUnavailable):
                await backend.call(lambda r: r.get("k"))
            assert time.monotonic() - started < 0.5
            assert not backend.is_up and backend.num_fallbacks == 1
            redis.thaw()
        finally:
            await backend.close()


async def test_connections_idle_when_redis_died_do_not_fail_it_again_once_it_is_back() -> None:
    """Regression: connections idle in the pool when Redis was killed still pointed at the dead
    server; once it was back, each failed when next used ("Connection closed by server"), sent
    the replica back to its fallback for another probe interval and counted a second outage."""
    with RedisServer() as redis:
        backend = RedisBackend(redis.url, timeout=0.2, probe_interval=0.2)
        try:
            await backend.warm(8)  # eight pooled connections, all idle
            redis.kill()
            with pytest.raises(RedisUnavailable):  # one call finds out; seven connections stay idle
                await backend.call(lambda r: r.ping())
            redis.start()  # same port, a new process
            await asyncio.sleep(backend.probe_interval + 0.05)
            await backend.call(lambda r: r.ping())  # the probe: Redis is up again
            for _ in range(3):  # enough concurrent calls to use every pooled connection
                await asyncio.gather(*(backend.call(lambda r: r.ping()) for _ in range(8)))
            assert backend.is_up and backend.num_fallbacks == 1
        finally:
            await backend.close()
