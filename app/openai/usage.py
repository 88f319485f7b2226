"""OpenAI response pieces the routes share: completion ids and the usage block.

The response bodies themselves are built as plain dicts (non-streaming, app/server/) and as JSON
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


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose K/V came from the prefix cache, not computed


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


def cached_tokens(per_choice: list[int], num_prompts: int) -> int:
    """usage.prompt_tokens_details.cached_tokens: per prompt, the fewest any of its choices reused
    (a prompt's n choices are prompt_index * n + choice), summed. The first choice computes
    what no earlier request left; the others reuse that (models/scheduler/scheduler.py), which is not
    a cache hit of this request's prompt."""
    n = len(per_choice) // max(num_prompts, 1)
    if n == 0:
        return 0
    return sum(min(per_choice[p * n : (p + 1) * n]) for p in range(num_prompts))
