"""Request bodies parsed as JSON whatever their Content-Type, and documented in the OpenAPI schema.

`curl -d '{...}'` sends `application/x-www-form-urlencoded`, and FastAPI would then not read
the JSON at all; OpenAI's API documents JSON bodies only, so the body is always JSON here.
Parsing with pydantic's own JSON parser also skips a `json.loads` pass.

Except from a browser: a request with an `Origin` header must say `application/json`. A web
page may POST `text/plain` or a form to any address without asking first (no CORS preflight), so
with auth off any site a user visits could otherwise run generations on a surge it can reach
(`localhost`, the office network). A JSON body from a page needs a preflight, which only the
`--cors-origin` origins pass. Clients that are not browsers send no `Origin`.

Because the body is read by a dependency rather than declared as a body parameter, FastAPI
does not see it; `documented_body` puts the model's JSON schema into the route's OpenAPI
operation, so `/openapi.json` (and schemathesis, and client generators) know what to send.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from middleware.errors import INVALID_REQUEST, OpenAIError

M = TypeVar("M", bound=BaseModel)

_DEFS_PREFIX = "#/$defs/"


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency that validates the raw body as `model`; errors become the usual 400."""

    async def parse(request: Request) -> M:
        if "origin" in request.headers and not _is_json(request.headers.get("content-type", "")):
            raise OpenAIError(
                "A browser request must send its body as Content-Type: application/json.",
                status_code=415,
                type=INVALID_REQUEST,
                code="unsupported_media_type",
            )
        try:
            return model.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None

    return parse


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def documented_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads `model` with `json_body`: its required JSON body.

    The schema is inlined (no `$ref`): pydantic's `$defs` would point into the schema itself,
    which an OpenAPI document cannot resolve. Our request models are not recursive.
    """
    schema = model.model_json_schema(mode="validation")
    defs = schema.pop("$defs", {})
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inline(schema, defs)}},
        }
    }


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX):
        rest = {key: value for key, value in node.items() if key != "$ref"}
        return {**_inline(defs[ref.removeprefix(_DEFS_PREFIX)], defs), **_inline(rest, defs)}
    return {key: _inline(value, defs) for key, value in node.items()}
