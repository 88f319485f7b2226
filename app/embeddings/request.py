"""The embeddings request body, as OpenAI defines it, with vLLM's `truncate_prompt_tokens`.

`input` is a string, a list of strings, a list of token ids (one input) or a list of such lists;
OpenAI's bounds hold: at most 2,048 inputs, none empty. Token ids are the served encoder's (a
client that tokenized for another model sends ids this one reads differently, as with OpenAI's
own models). `encoding_format` `float` (JSON numbers) or `base64` (little-endian float32s, what
the openai SDK asks for by default and decodes); `dimensions` shortens the vector where the model
allows it (models/embedding/encoder.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from app.openai.base import RequestModel
from app.openai.limits import MAX_INT

MAX_INPUTS = 2048  # OpenAI's bound per request
# OpenAI's bound on a request's tokens, all inputs together; past it, a 400 before any work.
MAX_REQUEST_TOKENS = 300_000
MAX_USER_CHARS = 256

_INPUT_SHAPE = "input must be a string, a list of strings, a list of token ids or a list of such lists"

TokenId = Annotated[int, Field(ge=0, le=MAX_INT)]
Input = str | list[str] | list[TokenId] | list[list[TokenId]]


class EmbeddingRequest(RequestModel):
    model: str
    input: Input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=MAX_INT)] | None = None
    user: Annotated[str, Field(max_length=MAX_USER_CHARS)] | None = None
    # vLLM's: keep the last N tokens of a longer input (-1: as many as the model reads) instead of a 400.
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=MAX_INT)] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _check_input(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value:
                raise ValueError("input must not be an empty string")
            return value
        if not isinstance(value, list) or not value:
            raise ValueError(f"{_INPUT_SHAPE}, not empty")
        if len(value) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} inputs per request, got {len(value)}")
        kinds = {type(item) for item in value}
        if kinds == {str}:
            if any(not item for item in value):
                raise ValueError("input must not contain an empty string")
        elif kinds == {list}:
            if any(not item for item in value):
                raise ValueError("input must not contain an empty list of token ids")
        elif kinds != {int}:
            raise ValueError(_INPUT_SHAPE)
        return value

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _check_truncation(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("truncate_prompt_tokens must be -1 (the model's length) or at least 1")
        return value

    def inputs(self) -> list[str | list[int]]:
        """One entry per input: text, or token ids."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if isinstance(value[0], int):  # one input as token ids; validation made every item an int
            return [value]
        return list(value)
