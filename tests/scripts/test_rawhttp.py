"""The load generator's HTTP/1.1 client against a real uvicorn server: chunked, sized and error
responses, keep-alive reuse, an abandoned stream, a refused connection; and `stream_chat` over it
against a real `surge serve`-equivalent app (SSE, usage, TTFT)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from scripts.benchkit.load import stream_chat
from scripts.benchkit.rawhttp import RawHttpClient, RawHttpError
from scripts.harness.ports import free_port
from tests.live_server import MODEL_NAME, running_server, serve_app


async def chunked(request: Request) -> Response:
    count = int(request.query_params.get("n", "3"))

    async def parts() -> AsyncIterator[bytes]:
        for i in range(count):
            yield f"part {i}\n".encode()
            await asyncio.sleep(0)

    return StreamingResponse(parts(), media_type="text/plain")


async def sized(request: Request) -> Response:
    body = await request.body()
    return PlainTextResponse(f"{request.method} {len(body)} {request.headers.get('x-tag', '')}")


async def peer(request: Request) -> Response:
    assert request.client is not None
    return PlainTextResponse(str(request.client.port))


async def teapot(request: Request) -> Response:
    return PlainTextResponse("no coffee", status_code=418)


APP = Starlette(
    routes=[
        Route("/chunked", chunked),
        Route("/sized", sized, methods=["GET", "POST"]),
        Route("/peer", peer),
        Route("/teapot", teapot),
    ]
)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_app(APP) as url:
        yield url


async def fetch(client: RawHttpClient, path: str, method: str = "GET", body: bytes = b"", **headers: str) -> str:
    async with client.stream(method, path, body, headers) as (response, chunks):
        text = b"".join([chunk async for chunk in chunks]).decode()
    return f"{response.status} {text}"


async def test_bodies_of_each_framing_and_a_reused_connection(base_url: str) -> None:
    client = RawHttpClient(base_url)
    try:
        assert await fetch(client, "/chunked?n=4") == "200 part 0\npart 1\npart 2\npart 3\n"
        assert await fetch(client, "/sized", "POST", b'{"a": 1}', **{"x-tag": "t1"}) == "200 POST 8 t1"
        assert await fetch(client, "/teapot") == "418 no coffee"
        # One connection served all of the above and serves the next ones: the same client port.
        ports = {await fetch(client, "/peer") for _ in range(3)}
        assert len(ports) == 1
    finally:
        await client.aclose()


async def test_an_abandoned_stream_closes_its_connection(base_url: str) -> None:
    client = RawHttpClient(base_url)
    try:
        first = await fetch(client, "/peer")
        async with client.stream("GET", "/chunked?n=1000") as (response, chunks):
            assert response.status == 200
            async for _ in chunks:
                break  # the server is still writing: this connection cannot carry another request
        assert await fetch(client, "/sized") == "200 GET 0 "
        assert await fetch(client, "/peer") != first  # a new connection
    finally:
        await client.aclose()


async def test_a_keep_alive_connection_the_server_closed_unanswered_is_retried_once_anew() -> None:
    """llama-server closes a connection after a stream without saying so; the next request on it
    got 0 bytes (IncompleteReadError). Nothing of it ran, so it is sent again on a new connection."""
    connections = 0

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")  # keep-alive, then gone
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RawHttpClient(f"http://127.0.0.1:{port}")
    try:
        assert await fetch(client, "/a") == "200 ok"
        await asyncio.sleep(0.05)  # the server has closed the idle connection by now
        assert await fetch(client, "/b") == "200 ok"
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert connections == 2


async def test_a_refused_connection_is_a_rawhttp_error() -> None:
    client = RawHttpClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there: refused
    with pytest.raises(RawHttpError):
        await fetch(client, "/")
    with pytest.raises(ValueError):
        RawHttpClient("https://example.com")


async def test_stream_chat_reads_an_openai_stream(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir) as live:
        client = RawHttpClient(live.url)
        try:
            body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            body |= {"stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
            results = [await stream_chat(client, "/v1/chat/completions", body) for _ in range(2)]
            bad = await stream_chat(client, "/v1/chat/completions", {**body, "max_tokens": -1})
        finally:
            await client.aclose()
    for result in results:
        assert result.error is None, result.error
        assert result.completion_tokens == 5 and result.prompt_tokens
        assert result.ttft_s is not None and result.e2e_s is not None and result.ttft_s <= result.e2e_s
        assert len(result.itl_s) >= 1
    assert bad.error is not None and bad.error.startswith("HTTP 400")


async def test_stream_chat_counts_a_canned_reply_as_an_error(tiny_model_dir: Path) -> None:
    """At degradation level 3 surge answers 200 with a canned reply the model never computed: the
    bench must not count its tokens. The memory bound set near zero holds the level at 3."""
    settings = {"degrade_memory_usage": 1e-4, "degrade_thresholds": "1,2,3,1000000000"}
    with running_server(tiny_model_dir, **settings) as live:
        client = RawHttpClient(live.url)
        try:
            body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            body |= {"stream": True, "stream_options": {"include_usage": True}}
            result = await stream_chat(client, "/v1/chat/completions", body)
        finally:
            await client.aclose()
    assert result.error == "degraded reply (x-surge-degraded: 3)" and result.completion_tokens == 0
