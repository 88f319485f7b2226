"""Server-sent events for OpenAI streams: framing, `[DONE]`, keep-alives, headers.

Each event is one JSON object on a `data:` line. While a stream has nothing to say (queued,
or a slow prefill) a comment line goes out every few seconds, because proxies cut streams
that are silent for 60 s; the openai SDK and curl ignore comments. The payloads come from the
engine as whole characters, so no event ever carries half a UTF-8 character.

NOTE: hand-written on Starlette's StreamingResponse rather than sse-starlette's
EventSourceResponse, on purpose: side by side under the overhead bench this module streams more
events per second for less server CPU (docs/performance.md, "SSE"). Per stream it runs four tasks
(sender, ping, exit watcher, disconnect listener) and a cancel scope per send, and it cannot end the
body with the last events in one write (`LastEvents`). Its exit watcher also cancels open streams
when the server receives SIGTERM, where surge's shutdown (app/server/shutdown.py) lets them run to the end.
What it would bring is here already: keep-alive comments (app/generation/streaming.py), disconnect detection
(Starlette's, under uvicorn's ASGI 2.3), cleanup however the response ends (`SSEResponse`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def event(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"


class LastEvents(bytes):
    """A stream's final bytes (the last tokens, usage, `[DONE]`): written together with the end
    of the chunked body, one write instead of three. On loopback each write runs the receiver's
    TCP path inside the sender's syscall: writes were a fifth of the HTTP process's CPU."""


class SSEResponse(StreamingResponse):
    """A StreamingResponse that always runs `on_close` when it ends, however it ends, and ends the
    body with a `LastEvents` chunk when the events end with one.

    NOTE: if the client is gone before the first chunk, Starlette cancels the response without
    ever starting the body generator, so a `finally` inside the generator never runs; the
    request's engine work would go on for nobody. `on_close` runs here in any case.
    """

    def __init__(
        self, events: AsyncIterator[bytes], headers: dict[str, str] | None, on_close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(events, media_type="text/event-stream", headers={**HEADERS, **(headers or {})})
        self._on_close = on_close

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        ended = False
        async for chunk in self.body_iterator:
            if ended:  # nothing may follow the end; the generator still runs to its own end
                continue
            ended = isinstance(chunk, LastEvents)
            body = chunk.encode(self.charset) if isinstance(chunk, str) else bytes(chunk)
            await send({"type": "http.response.body", "body": body, "more_body": not ended})
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Shielded: when the client is gone this task is being cancelled, and the cleanup
            # (abort in the engine, token refunds) must still run to the end.
            await asyncio.shield(self._on_close())


def sse_response(
    events: AsyncIterator[bytes], headers: dict[str, str] | None, on_close: Callable[[], Awaitable[None]]
) -> SSEResponse:
    return SSEResponse(events, headers, on_close)


def error_event(message: str, error_type: str = "server_error") -> bytes:
    """An error after the stream opened: the openai SDK raises on an event with an `error` key."""
    return event(json.dumps({"error": {"message": message, "type": error_type, "param": None, "code": None}}))
