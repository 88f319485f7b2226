"""The shared Redis connection's timeouts against a real redis-server: what counts as Redis not
answering, and what is only the event loop being busy."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from middleware.redis import RedisBackend, RedisUnavailable, redacted
from scripts.harness.ports import free_port
from scripts.harness.redis_server import RedisServer
from tests.live_server import MODEL_NAME, running_server


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
            # Ended by the call's own timeout, not the socket's backstop (1 s) nor never.
            for _ in range(backend.down_after):
                with pytest.raises(RedisUnavailable, match="within 50 ms"):
                    await backend.call(lambda r: r.get("k"))
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
            for _ in range(backend.down_after):  # these calls find out; the other connections stay idle
                with pytest.raises(RedisUnavailable):
                    await backend.call(lambda r: r.ping())
            assert not backend.is_up
            redis.start()  # same port, a new process
            await asyncio.sleep(backend.probe_interval + 0.05)
            await backend.call(lambda r: r.ping())  # the probe: Redis is up again
            for _ in range(3):  # enough concurrent calls to use every pooled connection
                await asyncio.gather(*(backend.call(lambda r: r.ping()) for _ in range(8)))
            assert backend.is_up and backend.num_fallbacks == 1
        finally:
            await backend.close()


async def test_one_late_reply_is_not_an_outage_but_consecutive_ones_are() -> None:
    """The finding: one late reply (a burst's event-loop lag, a Redis pause) marked Redis down, so
    every replica's next probe interval ran on its fallback share. Now each failed call falls back
    on its own, a success clears the count, and `down_after` failures in a row mark Redis down."""
    with RedisServer() as redis:
        backend = RedisBackend(redis.url, timeout=0.05, down_after=3)
        try:
            await backend.call(lambda r: r.ping())
            for _ in range(2):  # two late replies, then Redis answers: never down
                redis.freeze()
                for _ in range(backend.down_after - 1):
                    with pytest.raises(RedisUnavailable):
                        await backend.call(lambda r: r.get("k"))
                redis.thaw()
                assert await backend.call(lambda r: r.ping()) is True
                assert backend.is_up and backend.num_fallbacks == 0
            redis.freeze()
            for _ in range(backend.down_after):
                with pytest.raises(RedisUnavailable, match="within 50 ms"):
                    await backend.call(lambda r: r.get("k"))
            assert not backend.is_up and backend.num_fallbacks == 1
            with pytest.raises(RedisUnavailable, match="down"):  # no wait on a frozen socket now
                await backend.call(lambda r: r.get("k"))
            assert backend.num_failed_calls == 2 * (backend.down_after - 1) + backend.down_after
            redis.thaw()
        finally:
            await backend.close()


def _connected_clients(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return len(client.client_list()) - 1  # not this one
    finally:
        client.close()


async def test_connect_waits_for_a_redis_that_starts_late(caplog: pytest.LogCaptureFixture) -> None:
    """A pod often starts beside a Redis that is starting too: start-up retries with backoff, a
    log line per retry, and opens the pool once Redis answers; no outage is counted."""
    redis = RedisServer()  # its port is chosen; nothing listens yet
    backend = RedisBackend(redis.url, timeout=0.2)
    try:

        async def start_later() -> None:
            await asyncio.sleep(0.6)
            await asyncio.to_thread(redis.start)

        starter = asyncio.create_task(start_later())
        with caplog.at_level("WARNING", logger="surge.redis"):
            assert await backend.connect(attempts=20, num_connections=4, initial_wait=0.1, max_wait=0.2)
        await starter
        retries = [r for r in caplog.records if "retrying in" in r.getMessage()]
        assert retries, "no retry was logged"
        assert all(redis.url in r.getMessage() and "ConnectionError" in r.getMessage() for r in retries)
        assert [int(r.getMessage().split("attempt ")[1].split()[0]) for r in retries] == list(
            range(1, len(retries) + 1)
        )
        assert backend.is_up and backend.num_fallbacks == 0
        assert _connected_clients(redis.url) >= 4  # the pool was opened
        assert await backend.call(lambda r: r.set("k", "v")) is True
    finally:
        await backend.close()
        redis.stop()


async def test_connect_gives_up_after_its_attempts_and_the_probe_finds_redis_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    redis = RedisServer()
    backend = RedisBackend(redis.url, timeout=0.2, probe_interval=0.2)
    try:
        with caplog.at_level("WARNING", logger="surge.redis"):
            assert not await backend.connect(attempts=3, num_connections=4, initial_wait=0.05, max_wait=0.1)
        messages = [r.getMessage() for r in caplog.records]
        assert sum("retrying in" in m for m in messages) == 2  # one line per retry, none after the last
        assert any("did not answer in 3 attempts" in m for m in messages)
        assert not backend.is_up and backend.num_fallbacks == 1
        with pytest.raises(RedisUnavailable):  # while down, calls fail at once: the fallback's turn
            await backend.call(lambda r: r.ping())

        redis.start()
        await asyncio.sleep(backend.probe_interval + 0.05)
        assert await backend.call(lambda r: r.ping()) is True  # the probe: back on Redis
        assert backend.is_up
        for _ in range(50):  # the pool is opened again in the background
            if _connected_clients(redis.url) >= 4:
                break
            await asyncio.sleep(0.02)
        assert _connected_clients(redis.url) >= 4
    finally:
        await backend.close()
        redis.stop()


async def test_connect_to_a_frozen_redis_is_bounded_by_its_attempts(caplog: pytest.LogCaptureFixture) -> None:
    with RedisServer() as redis:
        redis.freeze()
        backend = RedisBackend(redis.url, timeout=0.05)
        try:
            with caplog.at_level("WARNING", logger="surge.redis"):
                connected = await backend.connect(
                    attempts=3, num_connections=2, initial_wait=0.05, max_wait=0.05, attempt_timeout=0.2
                )
            assert not connected and not backend.is_up
            # Three attempts, each ended by its own timeout (a frozen Redis never answers).
            messages = [r.getMessage() for r in caplog.records]
            retries = [m for m in messages if "retrying in" in m]
            assert len(retries) == 2 and all("TimeoutError" in m for m in retries), messages
            assert any("did not answer in 3 attempts (TimeoutError" in m for m in messages), messages
        finally:
            redis.thaw()
            await backend.close()


def test_the_redis_password_never_reaches_the_log(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The leak: `--redis-url redis://:password@host` went into every Redis log line whole. The
    server uses the password (a Redis with `requirepass` serves it), its log shows `***`."""
    redis = RedisServer(password="s3cret-redis-pass")
    redis.start()
    try:
        with caplog.at_level("INFO"), running_server(tiny_model_dir, max_model_len=256, redis_url=redis.url) as live:
            body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            url = f"{live.url}/v1/chat/completions"
            assert httpx.post(url, json=body, headers={"Idempotency-Key": "k1"}).status_code == 200
            assert (
                httpx.post(url, json=body, headers={"Idempotency-Key": "k1"}).headers["idempotent-replayed"] == "true"
            )
            redis.kill()  # the outage is logged, with the URL
            assert live.state.redis is not None
            for i in range(live.state.redis.down_after):
                httpx.post(url, json=body, headers={"Idempotency-Key": f"k{i + 2}"})
            assert live.state.redis is not None and not live.state.redis.is_up
        lines = [record.getMessage() for record in caplog.records if "redis at" in record.getMessage()]
        assert lines and all("redis://:***@127.0.0.1" in line for line in lines), lines
        assert "s3cret-redis-pass" not in caplog.text
    finally:
        redis.stop()


def test_the_cache_redis_can_evict_everything_and_no_rate_limit_bucket_goes_with_it(tiny_model_dir: Path) -> None:
    """The finding: one Redis under `allkeys-lru` held the rate-limit buckets beside 24 h of
    stored completions, so memory pressure from the caches could evict a bucket (a full one for
    its caller, past its limit). With --redis-cache-url the caches live in a Redis that may evict
    (here 8 MB, allkeys-lru, flooded) and the buckets in one that never does (noeviction)."""
    limits = RedisServer(args=("--maxmemory", "16mb", "--maxmemory-policy", "noeviction"))
    cache = RedisServer(args=("--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"))
    limits.start()
    cache.start()
    try:
        settings = {"redis_url": limits.url, "redis_cache_url": cache.url, "rate_limit_rpm": 3, "dedup_ttl_seconds": 0}
        with running_server(tiny_model_dir, max_model_len=256, **settings) as live:
            url = f"{live.url}/v1/chat/completions"
            body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            for i in range(3):
                response = httpx.post(url, json=body, headers={"Idempotency-Key": f"k{i}"})
                assert response.status_code == 200, response.text
            import redis as redis_client

            with redis_client.Redis.from_url(cache.url) as direct:
                stored = [key.decode() for key in direct.scan_iter("surge:*")]
                assert stored and all(key.startswith("surge:idempotency") for key in stored), stored
                for i in range(1600):  # 16 MB into an 8 MB Redis: it evicts
                    direct.set(f"filler:{i}", b"x" * 10_000)
                assert int(direct.info("stats")["evicted_keys"]) > 0
            with redis_client.Redis.from_url(limits.url) as direct:
                buckets = [key.decode() for key in direct.scan_iter("surge:*")]
                assert buckets and all(key.startswith("surge:ratelimit:") for key in buckets), buckets
            over = httpx.post(url, json=body)
            assert over.status_code == 429  # the bucket survived the cache's eviction
    finally:
        cache.stop()
        limits.stop()


def test_a_rediss_url_reaches_redis_over_tls(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`rediss://` (TLS, redis-py's) with the CA in the URL: the limits are kept in a Redis that
    listens on TLS, with a password, and the log still shows no password."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)),
            *("-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    tls_port = free_port()
    tls = ("--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key))
    redis = RedisServer(password="tls-pass", args=(*tls, "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"))
    redis.start()  # the harness pings its plain port; surge gets only the TLS one
    try:
        url = f"rediss://:tls-pass@127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}"
        with running_server(tiny_model_dir, max_model_len=256, redis_url=url, rate_limit_rpm=2) as live:
            body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            statuses = [httpx.post(f"{live.url}/v1/chat/completions", json=body).status_code for _ in range(3)]
            assert statuses == [200, 200, 429]
            assert live.state.redis is not None and live.state.redis.is_up and live.state.redis.num_failed_calls == 0
            assert live.state.redis.url.startswith(f"rediss://:***@127.0.0.1:{tls_port}/0")
        assert redis.ping()
    finally:
        redis.stop()


def test_redacted_keeps_everything_but_the_password() -> None:
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redacted("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert redacted("rediss://user:pw@host/1") == "rediss://user:***@host/1"
