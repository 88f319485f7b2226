"""IdempotencyMiddleware's rules around a small app that answers as told, under real uvicorn.

The app's response is chosen by the request body (status, delay, stream, error event, raise)
and carries a run counter, so a test can tell a replay (same run) from a new run. Every test
runs with the in-process store and with a real redis-server. The real server and model are
in `test_idempotency.py`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from middleware.edge.auth import ApiKeyMiddleware
from middleware.idempotency.asgi import IdempotencyMiddleware
from middleware.idempotency.redis_store import RedisIdempotencyStore
from middleware.idempotency.store import IdempotencyStore, InMemoryIdempotencyStore
from middleware.redis import RedisBackend
from scripts.harness.redis_server import RedisServer
from tests.live_server import serve_app

PATH = "/v1/chat/completions"
LEASE = 1.0  # short, so the slow-response test needs the lease to be extended (and long enough
# that a busy CI machine still extends it in time)


def build_app(store: IdempotencyStore, runs: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()

    @app.post(PATH)
    async def answer(request: Request) -> Response:
        spec = json.loads(await request.body())
        runs.append(spec)
        run = len(runs)
        if spec.get("raise"):
            raise RuntimeError("injected failure")
        await asyncio.sleep(spec.get("delay", 0))
        if not spec.get("stream"):
            return JSONResponse({"run": run}, status_code=spec.get("status", 200), headers={"x-run": str(run)})

        async def events() -> AsyncIterator[bytes]:
            for i in range(spec.get("num_events", 3)):
                await asyncio.sleep(spec.get("event_delay", 0))
                yield f'data: {{"run": {run}, "i": {i}}}\n\n'.encode()
            if spec.get("error_event"):
                yield b'data: {"error": {"message": "the model failed", "type": "server_error"}}\n\n'
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-store"})

    app.add_middleware(IdempotencyMiddleware, store=store)
    app.add_middleware(ApiKeyMiddleware, api_keys=["k1", "k2"])  # outermost: it sets the scope's api_key
    return app


@pytest.fixture(scope="module", params=["memory", "redis"])
def base_url(request: pytest.FixtureRequest) -> Iterator[str]:
    store: IdempotencyStore
    if request.param == "memory":
        store = InMemoryIdempotencyStore(ttl_seconds=60, lease_seconds=LEASE)
    else:
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        store = RedisIdempotencyStore(RedisBackend(redis_server.url, timeout=2.0), ttl_seconds=60, lease_seconds=LEASE)
    with serve_app(build_app(store, [])) as url:
        yield url


def call(base_url: str, spec: dict[str, Any], key: str, api_key: str = "k1", **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": key}
    return httpx.post(base_url + PATH, json=spec, headers=headers, timeout=10, **kwargs)


def new_key() -> str:
    return str(uuid.uuid4())


@pytest.mark.parametrize("status", [200, 201, 400, 404, 422])
def test_success_and_validation_errors_are_stored(base_url: str, status: int) -> None:
    key = new_key()
    first = call(base_url, {"status": status}, key)
    again = call(base_url, {"status": status}, key)
    assert first.status_code == again.status_code == status
    assert again.content == first.content
    assert again.headers["x-run"] == first.headers["x-run"]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503])
def test_failures_a_retry_could_fix_are_not_stored(base_url: str, status: int) -> None:
    key = new_key()
    first = call(base_url, {"status": status}, key)
    assert first.status_code == status
    retry = call(base_url, {"status": 200}, key)  # different body: a released key is free again
    assert retry.status_code == 200
    assert "idempotent-replayed" not in retry.headers
    assert call(base_url, {"status": 200}, key).headers["idempotent-replayed"] == "true"


def test_an_exception_in_the_app_releases_the_key(base_url: str) -> None:
    key = new_key()
    assert call(base_url, {"raise": True}, key).status_code == 500
    retry = call(base_url, {"raise": True}, key)
    assert retry.status_code == 500  # it ran again (and failed again), no 409 and no replay
    assert "idempotent-replayed" not in retry.headers


def test_keys_are_scoped_per_api_key(base_url: str) -> None:
    key = new_key()
    first = call(base_url, {}, key, api_key="k1")
    other = call(base_url, {}, key, api_key="k2")
    assert first.json()["run"] != other.json()["run"]
    assert "idempotent-replayed" not in other.headers
    assert call(base_url, {}, key, api_key="k2").json() == other.json()
    # A different body under a key of another API key is no conflict either.
    assert call(base_url, {"status": 201}, new_key(), api_key="k2").status_code == 201


def test_the_lease_is_extended_while_a_slow_response_runs(base_url: str) -> None:
    key = new_key()
    spec = {"delay": LEASE * 3}
    results: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: results.append(call(base_url, spec, key)))
    thread.start()
    time.sleep(LEASE * 2)  # two leases later the first request still holds the key
    during = call(base_url, spec, key)
    thread.join()
    assert during.status_code == 409
    assert during.headers["retry-after"] == "1"
    assert during.json()["error"]["code"] == "idempotency_key_in_use"
    assert call(base_url, spec, key).content == results[0].content


def test_a_stream_cut_short_by_the_client_is_not_stored(base_url: str) -> None:
    key = new_key()
    spec = {"stream": True, "num_events": 20, "event_delay": 0.02}
    headers = {"Authorization": "Bearer k1", "Idempotency-Key": key}
    with httpx.stream("POST", base_url + PATH, json=spec, headers=headers) as response:
        next(response.iter_lines())
    deadline = time.monotonic() + 3
    while (retry := call(base_url, spec, key)).status_code == 409:  # until the server notices
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert retry.status_code == 200
    assert "idempotent-replayed" not in retry.headers
    assert retry.text.endswith("data: [DONE]\n\n")


def test_a_stream_that_carries_an_error_event_is_not_stored(base_url: str) -> None:
    key = new_key()
    failed = call(base_url, {"stream": True, "error_event": True}, key)
    assert failed.status_code == 200 and '"error"' in failed.text
    retry = call(base_url, {"stream": True}, key)
    assert "idempotent-replayed" not in retry.headers
    assert '"error"' not in retry.text


def test_a_chunked_body_reaches_the_app_whole_and_is_fingerprinted(base_url: str) -> None:
    key = new_key()
    body = json.dumps({"status": 201, "padding": "x" * 5000}).encode()
    headers = {"Authorization": "Bearer k1", "Idempotency-Key": key}

    def chunked(data: bytes) -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding chunked
        yield from (data[i : i + 1000] for i in range(0, len(data), 1000))

    first = httpx.post(base_url + PATH, content=chunked(body), headers=headers)
    assert first.status_code == 201
    # The same JSON with other spacing and key order is the same request.
    same = json.dumps({"padding": "x" * 5000, "status": 201}, indent=2).encode()
    replay = httpx.post(base_url + PATH, content=chunked(same), headers=headers)
    assert replay.headers["idempotent-replayed"] == "true"
    other = httpx.post(base_url + PATH, content=json.dumps({"status": 202}).encode(), headers=headers)
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"


def test_without_the_header_the_request_passes_untouched() -> None:
    """No Idempotency-Key: the app gets the server's own `receive`, and the store is never asked."""
    seen: list[Receive] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(receive)

    class NoStore:
        ttl_seconds = lease_seconds = 1.0

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the store was used: {name}")

    async def receive() -> Message:
        raise AssertionError("the body was read")

    async def send(message: Message) -> None:
        raise AssertionError("the middleware answered")

    middleware = IdempotencyMiddleware(app, store=NoStore())  # type: ignore[arg-type]
    for method, headers in (("POST", []), ("GET", [(b"idempotency-key", b"k")])):
        scope = {"type": "http", "method": method, "path": PATH, "headers": headers}
        asyncio.run(middleware(scope, receive, send))
    assert seen == [receive, receive]
