"""OpenAI response pieces the routes share: completion ids and the usage block.

The response bodies themselves are built as plain dicts (non-streaming, app/routes/) and as JSON
strings (streaming, `chunks.py`), to OpenAI's shapes; tests check both against the openai SDK's
own types. Serialise usage with `model_dump()`: OpenAI sends every field, never omits one.
"""

from __future__ import annotations

import uuid

from pydantic import BaseModel


def new_chat_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def new_completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
