"""Errors in the shape of the protocol that was called: Anthropic's on `/v1/messages`.

Every layer and route renders OpenAI's error body (`{"error": {"message", "type", "param",
"code"}}`, middleware/errors.py). An Anthropic client reads `{"type": "error", "error": {"type",
"message"}}`, with its own type names by status. Outermost but for the request id, so a rejection
from any layer (a 401, a 413, a 429, a 503) is rewritten too; only error responses with a JSON
body on those paths are held, the rest pass through untouched (streams included).
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ANTHROPIC_PATHS = ("/v1/messages",)
# Anthropic's error types by HTTP status (its API's errors page).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> bytes:
    kind = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


class ErrorShapeMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(ANTHROPIC_PATHS):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body: list[bytes] = []

        async def reshape(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                is_json = any(n == b"content-type" and v.startswith(b"application/json") for n, v in message["headers"])
                if message["status"] >= 400 and is_json:
                    start = message  # held until the body is whole
                    return
                await send(message)
                return
            if start is None:
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            reshaped = _reshape(start["status"], b"".join(body))
            headers = [(n, v) for n, v in start["headers"] if n != b"content-length"]
            headers.append((b"content-length", str(len(reshaped)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": reshaped, "more_body": False})

        await self.app(scope, receive, reshape)


def _reshape(status: int, raw: bytes) -> bytes:
    try:
        error = json.loads(raw).get("error")
        message = error["message"] if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError, KeyError, TypeError):
        return raw  # not an OpenAI error body: left as it is
    return anthropic_error(status, str(message))
