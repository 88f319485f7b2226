"""OpenAI-shaped errors, for every layer: the exception the after-parse layers and routes raise,
and the bytes pure ASGI middleware send.

Owns `{"error": {"message", "type", "param", "code"}}` and its HTTP status. The after-parse
layers and the routes raise `OpenAIError` (app/server/errors.py renders it, with FastAPI's and
Starlette's own failures); pure ASGI middleware cannot raise into those handlers (they sit
inside the middleware stack), so they answer directly with `error_json` and `send_error`.
Must not import `app/` or the engine.

NOTE: the error envelope's field names are OpenAI's; they live here (and in `app/schemas`)
because middleware must produce them without importing `app/`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

from starlette.responses import Response
from starlette.types import Send

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


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


def json_response(status_code: int, body: bytes, headers: Mapping[str, str]) -> Response:
    return Response(body, status_code=status_code, headers=dict(headers), media_type="application/json")


class OpenAIError(Exception):
    """An error with everything needed to render OpenAI's error body; raise it from routes."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        type: str,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def to_json(self) -> bytes:
        return error_json(self.message, type=self.type, param=self.param, code=self.code)

    def to_response(self) -> Response:
        return json_response(self.status_code, self.to_json(), self.headers)


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(message, status_code=400, type=INVALID_REQUEST, param=param, code=code)


def not_found(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(message, status_code=404, type=INVALID_REQUEST, param=param)


def not_found_model(model: str) -> OpenAIError:
    return OpenAIError(
        f"The model `{model}` does not exist.",
        status_code=404,
        type=INVALID_REQUEST,
        param="model",
        code="model_not_found",
    )


def service_unavailable(message: str, retry_after: float) -> OpenAIError:
    # The SDK honours `retry-after-ms` (precise) and `retry-after` (whole seconds, per HTTP).
    headers = {
        "retry-after": str(max(1, math.ceil(retry_after))),
        "retry-after-ms": str(max(1, round(retry_after * 1000))),
    }
    return OpenAIError(message, status_code=503, type=SERVER_ERROR, code="service_unavailable", headers=headers)


def server_error(message: str = "The server had an error while processing your request.") -> OpenAIError:
    return OpenAIError(message, status_code=500, type=SERVER_ERROR)
