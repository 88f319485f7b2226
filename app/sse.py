"""Server-sent events for OpenAI streams: framing, `[DONE]`, keep-alives, headers.

Each event is one JSON object on a `data:` line. While a stream has nothing to say (queued,
or a slow prefill) a comment line goes out every few seconds, because proxies cut streams
that are silent for 60 s; the openai SDK and curl ignore comments. The payloads come from the
engine as whole characters, so no event ever carries half a UTF-8 character.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def event(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=HEADERS)


def error_event(message: str, error_type: str = "server_error") -> bytes:
    """An error after the stream opened: the openai SDK raises on an event with an `error` key."""
    return event(json.dumps({"error": {"message": message, "type": error_type, "param": None, "code": None}}))
