"""OpenAI response bodies: non-streaming completions, models, usage, logprobs and errors.

Owns the shapes of what we send back. These pydantic models document the API (they appear in
the OpenAPI schema) and serialise the non-streaming responses; per-token streaming chunks are
built as plain JSON in `chunks.py` for speed, to the same shapes as the `*Chunk` models here.

Serialise with `model_dump_json()` (not `exclude_none`): OpenAI sends `"logprobs": null`.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field

FinishReason = Literal["stop", "length"]


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


# -- chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


# -- legacy completion logprobs: parallel lists, one entry per generated token


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int] = Field(default_factory=list)


# -- chat completions


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE event of a streamed chat completion (built by `chunks.ChatChunkEncoder`).

    With `stream_options.include_usage`, every chunk carries `"usage": null` except a final one
    with `"choices": []` and the usage.
    """

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# -- legacy completions (streamed chunks have the same object name as the full response)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(BaseModel):
    """One SSE event of a streamed completion (built by `chunks.CompletionChunkEncoder`)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# -- /v1/models


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "surge"
    max_model_len: int | None = None  # vLLM's extension: the context length


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# -- errors (rendered by app/errors.py; described here for the OpenAPI schema)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
