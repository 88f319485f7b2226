"""The SSE response: framing, headers, and its close hook."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.types import Message

from app.generation.sse import DONE, HEADERS, event, sse_response


async def _events(started: list[bool]) -> AsyncIterator[bytes]:
    started.append(True)
    yield event('{"x":1}')
    yield DONE


def test_close_hook_runs_when_the_client_is_gone_before_the_first_byte() -> None:
    # Regression: Starlette cancels a streaming response whose client has already gone without
    # ever starting its body generator, so a `finally` in the generator cannot abort the engine
    # request; the response's own close hook must.
    started: list[bool] = []
    closed: list[bool] = []
    sent: list[Message] = []

    async def on_close() -> None:
        closed.append(True)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        await asyncio.sleep(0)

    async def main() -> None:
        response = sse_response(_events(started), {"x-test": "1"}, on_close)
        scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": "/", "headers": []}
        await response(scope, receive, send)

    asyncio.run(main())
    assert started == []  # the scenario: the body generator never ran
    assert closed == [True]


def test_a_normal_stream_is_framed_and_closed_once() -> None:
    started: list[bool] = []
    closed: list[bool] = []
    sent: list[Message] = []

    async def on_close() -> None:
        closed.append(True)

    async def receive() -> Message:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    async def main() -> None:
        response = sse_response(_events(started), None, on_close)
        scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": "/", "headers": []}
        await response(scope, receive, send)

    asyncio.run(main())
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert headers["content-type"].startswith("text/event-stream")
    assert all(headers[name.lower()] == value for name, value in HEADERS.items())
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert body == b'data: {"x":1}\n\n' + DONE
    assert started == [True] and closed == [True]
