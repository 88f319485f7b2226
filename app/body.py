"""Request bodies parsed as JSON whatever their Content-Type.

`curl -d '{...}'` sends `application/x-www-form-urlencoded`, and FastAPI would then not read
the JSON at all; OpenAI's API documents JSON bodies only, so the body is always JSON here.
Parsing with pydantic's own JSON parser also skips a `json.loads` pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency that validates the raw body as `model`; errors become the usual 400."""

    async def parse(request: Request) -> M:
        try:
            return model.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None

    return parse
