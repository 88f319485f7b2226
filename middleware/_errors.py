"""OpenAI-shaped error bodies for pure ASGI middleware.

Owns the bytes of `{"error": {"message", "type", "param", "code"}}` and a helper that sends
them as a complete response. Middleware cannot raise into FastAPI's exception handlers (they
sit inside the middleware stack), so they answer directly with these. Must not import `app/`
or `models/`: `app/errors.py` builds on this module, never the other way round.

NOTE: the error envelope's field names are OpenAI's; they live here (and in
`app/schemas`) because middleware must produce them without importing `app/`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from starlette.types import Send


def error_json(message: str, *, type: str, param: str | None = None, code: str | None = None) -> bytes:
    """The UTF-8 JSON body of an OpenAI error."""
    error = {"message": message, "type": type, "param": param, "code": code}
    return json.dumps({"error": error}, ensure_ascii=False, separators=(",", ":")).encode()


async def send_error(send: Send, status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> None:
    """Send a complete JSON response; the caller must not have started a response yet."""
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("latin-1")),
    ]
    raw_headers.extend((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers)
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
