"""The Messages API request body, as Anthropic's API takes it: every field it accepts is accepted.

`max_tokens` is required, as Anthropic's. `cache_control` marks, `metadata`, `service_tier`,
`container`, `mcp_servers` and the `anthropic-beta` header are accepted and change nothing here
(surge's prefix cache needs no marks). `temperature` is 0-1, as Anthropic's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from app.generation.validation import OneChoice
from app.openai.base import CacheSalted, RequestModel
from app.openai.limits import MAX_CONTENT_PARTS, MAX_INT, MAX_MESSAGES, MAX_STOP_LENGTH, MAX_TOOLS
from middleware.admission.priority import MAX_PRIORITY
from models import MAX_STOP_STRINGS, SamplingParams

StopSequence = Annotated[str, Field(max_length=MAX_STOP_LENGTH)]


class AnthropicTool(RequestModel):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent for a client tool; server tools have their own


class ToolChoiceParam(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class MessageParam(RequestModel):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_CONTENT_PARTS)]


class MessagesRequest(OneChoice, CacheSalted, RequestModel):
    model: str
    max_tokens: int = Field(ge=1, le=MAX_INT)
    messages: list[MessageParam] = Field(max_length=MAX_MESSAGES)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[StopSequence] | None = Field(None, max_length=MAX_STOP_STRINGS)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=MAX_INT)
    stream: bool = False
    tools: list[AnthropicTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceParam | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    # surge's extension, as chat's: lower runs first within the key's tier.
    priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    # vLLM's extension, as chat's: generate until max_tokens whatever the model says.
    ignore_eos: bool = False

    def to_sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            stop=tuple(stop for stop in self.stop_sequences or () if stop),
            ignore_eos=self.ignore_eos,
            cache_salt=self.cache_salt or "",
        )


class CountTokensRequest(MessagesRequest):
    """`POST /v1/messages/count_tokens`: a Messages body without `max_tokens`."""

    max_tokens: int = Field(1, ge=1, le=MAX_INT)
