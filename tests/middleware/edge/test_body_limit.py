"""BodyLimitMiddleware through a real uvicorn server, read by httpx and by the openai SDK."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from app.server.errors import install_error_handlers
from middleware.edge.body_limit import BodyLimitMiddleware
from tests.live_server import serve_app

LIMIT = 1000


def build_app(calls: list[str]) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict[str, int]:
        calls.append("echo")
        return {"num_bytes": len(await request.body())}

    @app.post("/v1/stream")
    async def stream(request: Request) -> StreamingResponse:
        # Streams after reading the body: Starlette then listens for a disconnect with
        # `receive`, which is where a body replayed forever used to spin.
        num_bytes = len(await request.body())

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(3):
                await asyncio.sleep(0.01)
                yield f"{num_bytes}\n".encode()

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": []}

    @app.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        calls.append("chat")
        return {}

    app.add_middleware(BodyLimitMiddleware, max_body_bytes=LIMIT)
    return app


@pytest.fixture(scope="module")
def calls() -> list[str]:
    return []


@pytest.fixture(scope="module")
def base_url(calls: list[str]) -> Iterator[str]:
    with serve_app(build_app(calls)) as url:
        yield url


@pytest.fixture
def http(base_url: str, calls: list[str]) -> Iterator[httpx.Client]:
    calls.clear()
    with httpx.Client(base_url=base_url, timeout=10) as client:
        yield client


def chunked(data: bytes, piece: int = 100) -> Iterator[bytes]:
    """A body httpx sends with Transfer-Encoding: chunked (no Content-Length)."""
    for start in range(0, len(data), piece):
        yield data[start : start + piece]


def assert_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "payload_too_large"
    assert str(LIMIT) in error["message"]


@pytest.mark.parametrize("size", [0, 10, LIMIT])
def test_bodies_up_to_the_limit_pass(http: httpx.Client, size: int) -> None:
    response = http.post("/v1/echo", content=b"x" * size)
    assert response.status_code == 200
    assert response.json() == {"num_bytes": size}


def test_declared_oversize_is_413_before_the_app_runs(http: httpx.Client, calls: list[str]) -> None:
    assert_too_large(http.post("/v1/echo", content=b"x" * (LIMIT + 1)))
    assert calls == []


def test_connection_stays_usable_after_a_413(http: httpx.Client) -> None:
    assert_too_large(http.post("/v1/echo", content=b"x" * (LIMIT * 5)))
    assert http.post("/v1/echo", content=b"ok").json() == {"num_bytes": 2}


@pytest.mark.parametrize("size", [1, LIMIT])
def test_chunked_bodies_up_to_the_limit_reach_the_app_whole(http: httpx.Client, size: int) -> None:
    response = http.post("/v1/echo", content=chunked(b"y" * size))
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert response.json() == {"num_bytes": size}


def test_chunked_oversize_is_413_and_the_app_never_runs(http: httpx.Client, calls: list[str]) -> None:
    assert_too_large(http.post("/v1/echo", content=chunked(b"z" * (LIMIT + 1))))
    assert calls == []


def test_get_without_a_body_passes(http: httpx.Client) -> None:
    assert http.get("/v1/models").status_code == 200


def test_chunked_body_replayed_once_does_not_spin_disconnect_listener(http: httpx.Client) -> None:
    # Regression: a `receive` that replays the body forever makes Starlette's
    # disconnect listener spin, and the streamed response never finishes.
    response = http.post("/v1/stream", content=chunked(b"s" * 500), timeout=5)
    assert response.status_code == 200
    assert response.text == "500\n" * 3


def test_sdk_sees_413_as_api_status_error(base_url: str, calls: list[str]) -> None:
    calls.clear()
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=10)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * LIMIT}])
    assert info.value.status_code == 413
    assert info.value.code == "payload_too_large"
    assert "too large" in info.value.message
    assert calls == []


@pytest.mark.parametrize("limit", [-1, 1.5, True])
def test_invalid_limits_are_refused(limit: object) -> None:
    with pytest.raises(ValueError):
        BodyLimitMiddleware(FastAPI(), max_body_bytes=limit)  # type: ignore[arg-type]
