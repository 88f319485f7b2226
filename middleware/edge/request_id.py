"""A request id for every HTTP request, as a pure ASGI middleware.

Owns the `X-Request-Id` header and the context variable that carries the id through the
request: a client's id is kept when it is sane (1-128 printable ASCII characters), anything
else is replaced by a fresh one; the id is echoed on the response and set in
`current_request_id` for the whole request, so every log line written while serving it (the
access log included: uvicorn writes it from inside the app's `send`) can carry it.
Knows nothing of logging formats or the engine.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
MAX_REQUEST_ID_LENGTH = 128

# The id of the request being served in this context; "" outside a request.
current_request_id: ContextVar[str] = ContextVar("surge_request_id", default="")


def is_sane_request_id(value: str) -> bool:
    """1-128 printable ASCII characters, no spaces: safe to echo in a header and a log line."""
    return 0 < len(value) <= MAX_REQUEST_ID_LENGTH and all("!" <= ch <= "~" for ch in value)


def new_request_id() -> str:
    return uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_request_id(scope) or new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        raw_id = request_id.encode("ascii")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                headers.append((HEADER, raw_id))
                message = {**message, "headers": headers}
            await send(message)

        token = current_request_id.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current_request_id.reset(token)


def _client_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == HEADER:
            try:
                text = value.decode("ascii")
            except UnicodeDecodeError:
                return None
            return text if is_sane_request_id(text) else None
    return None
