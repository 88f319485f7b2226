"""The handlers that render every failure as an OpenAI error body with the right HTTP status.

Owns the mapping from failures to `{"error": {"message", "type", "param", "code"}}`: our own
`OpenAIError` (middleware/errors.py, raised by the after-parse layers and the routes), FastAPI's
request validation errors (400, not FastAPI's 422 shape), Starlette's HTTP exceptions (404, 405,
...) and anything uncaught (500). The OpenAI SDK picks its exception class from the status alone
and reads message/param/code from the body.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from middleware.errors import (
    INVALID_REQUEST,
    SERVER_ERROR,
    OpenAIError,
    error_json,
    invalid_request,
    json_response,
    server_error,
)

logger = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OpenAIError, _handle_openai_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _handle_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _handle_http_exception)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnect, _handle_client_disconnect)  # type: ignore[arg-type]
    # NOTE: Starlette runs the `Exception` handler in ServerErrorMiddleware, which re-raises
    # after responding, so uvicorn logs the traceback a second time.
    app.add_exception_handler(Exception, _handle_uncaught)


async def _handle_openai_error(request: Request, exc: OpenAIError) -> Response:
    return exc.to_response()


async def _handle_validation_error(request: Request, exc: RequestValidationError) -> Response:
    message, param = describe_validation_errors(exc.errors())
    return invalid_request(message, param=param).to_response()


async def _handle_http_exception(request: Request, exc: StarletteHTTPException) -> Response:
    message = str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"Invalid URL ({request.method} {request.url.path})"
    elif exc.status_code == 405 and message == "Method Not Allowed":
        message = f"Method {request.method} is not allowed for {request.url.path}"
    error_type = SERVER_ERROR if exc.status_code >= 500 else INVALID_REQUEST
    body = error_json(message, type=error_type)
    return json_response(exc.status_code, body, exc.headers or {})


async def _handle_client_disconnect(request: Request, exc: ClientDisconnect) -> Response:
    """The client left while its body was read or its whole reply was generated (app/generation/
    collect.py's ClientDisconnected): nobody to answer, and not our error.

    NOTE: 499 (nginx's "client closed request"); without this it was an "Unhandled error" traceback
    in the log and a 500 in the HTTP metrics."""
    logger.debug("client disconnected before the reply to %s %s", request.method, request.url.path)
    return Response(status_code=499)


async def _handle_uncaught(request: Request, exc: Exception) -> Response:
    logger.error("Unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return server_error().to_response()


# Pydantic names the failed branch of a union in the error location ("str", "list[TextPart]",
# "function-after[...]"); those are not request fields, so they are left out of `param`.
_FIELD_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})
_LOC_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})


def describe_validation_errors(errors: Sequence[Any]) -> tuple[str, str | None]:
    """One readable message and the offending field path (e.g. `messages.0.content`).

    Reports the most specific error (longest location); alternatives that failed at the same
    path, which is how pydantic reports a union, are joined into one message.
    """
    if not errors:
        return "Invalid request.", None
    if errors[0].get("type") == "json_invalid":
        detail = errors[0].get("ctx", {}).get("error", "invalid JSON")
        return f"We could not parse the JSON body of your request ({detail}).", None

    paths = [_field_path(error.get("loc", ())) for error in errors]
    chosen = max(range(len(errors)), key=lambda i: len(paths[i]))  # max() keeps the first of ties
    path = paths[chosen]
    reasons: list[str] = []
    for error, error_path in zip(errors, paths, strict=True):
        if error_path == path and (reason := _reason(error)) not in reasons:
            reasons.append(reason)
    param = ".".join(str(part) for part in path) or None
    if errors[chosen].get("type") == "missing" and param is not None:
        return f"Missing required parameter: '{param}'.", param
    reason = " or ".join(reasons)
    return (f"Invalid value for '{param}': {reason}" if param else reason), param


def _field_path(loc: Sequence[Any]) -> tuple[str | int, ...]:
    parts = list(loc)
    if parts and parts[0] in _LOC_SOURCES:
        parts = parts[1:]
    return tuple(
        part
        for part in parts
        if isinstance(part, int) or (_FIELD_NAME.match(part) is not None and part not in _TYPE_NAMES)
    )


def _reason(error: Mapping[str, Any]) -> str:
    message = str(error.get("msg", "invalid value"))
    # Our validators raise ValueError; pydantic prefixes its message with this.
    return message.removeprefix("Value error, ")
