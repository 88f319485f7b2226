"""Request body size limit as a pure ASGI middleware.

Owns one rule: no request body larger than `max_body_bytes` reaches the app. Oversized requests
get a 413 with OpenAI's error body.

How, and why this way:
- With a `Content-Length` header (what the OpenAI SDK, httpx and curl send), the size is known
  up front: an oversized request is answered before any of its body is read, and the app is
  never called. The server checks that the body matches the header, so no counting is needed.
- Without one (a chunked upload), the middleware reads the whole body itself, stopping with a
  413 as soon as it grows past the limit, and only then calls the app. Checking inside the app's
  `receive` instead would raise in the middle of FastAPI's body parsing, which turns any
  exception into its own 400, and could come after the app has started a response.
  Buffering costs nothing extra here: every route of ours reads the whole JSON body anyway.
- NOTE: the buffered body is replayed exactly once; after that the app's `receive` is the
  server's own, so a later `receive` waits for `http.disconnect` as it should. Replaying the
  body forever makes Starlette's disconnect listener spin: the request hangs at full CPU and
  ignores SIGTERM.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from middleware.errors import error_json, send_error


class BodyLimitMiddleware:
    """`max_body_bytes`: a number, or a function read per request (a limit that follows from the
    served model, which is known only once it has loaded)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int | Callable[[], int]) -> None:
        if not callable(max_body_bytes) and (
            isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 0
        ):
            raise ValueError("max_body_bytes must be a non-negative integer")
        self.app = app
        self._limit: Callable[[], int] = max_body_bytes if callable(max_body_bytes) else lambda: max_body_bytes

    @property
    def max_body_bytes(self) -> int:
        return self._limit()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        max_body_bytes = self._limit()
        content_length = _content_length(scope)
        if content_length is not None:
            if content_length > max_body_bytes:
                await self._reject(send)
                return
            await self.app(scope, receive, send)
            return

        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left mid-upload: there is nobody to answer
            body += message.get("body", b"")
            if len(body) > max_body_bytes:
                await self._reject(send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay_once(bytes(body), receive), send)

    async def _reject(self, send: Send) -> None:
        message = f"Request body too large: the limit is {self.max_body_bytes} bytes."
        body = error_json(message, type="invalid_request_error", code="payload_too_large")
        await send_error(send, 413, body)


def _content_length(scope: Scope) -> int | None:
    """The declared body size, or None when absent or unparseable (then we count instead)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay_once(body: bytes, receive: Receive) -> Receive:
    is_replayed = False

    async def replaying_receive() -> Message:
        nonlocal is_replayed
        if is_replayed:
            return await receive()
        is_replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replaying_receive
