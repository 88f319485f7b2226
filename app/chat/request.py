"""The Chat Completions request body: messages and tools, on top of the sampling fields OpenAI's
generation requests share (app/openai/requests.py, whose docstring gives the choices behind both)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from app.openai.base import RequestModel
from app.openai.limits import (
    MAX_CONTENT_PARTS,
    MAX_INT,
    MAX_MESSAGE_TOOL_CALLS,
    MAX_MESSAGES,
    MAX_TEMPLATE_KWARGS,
    MAX_TOOLS,
)
from app.openai.requests import SamplingRequest
from app.openai.tools import MessageToolCall, NamedToolChoice, ToolChoice, ToolDefinition
from models import MAX_TOP_LOGPROBS, SamplingParams


class TextContentPart(RequestModel):
    type: Literal["text"]
    text: str


ChatRole = Literal["system", "developer", "user", "assistant", "tool"]


class ChatMessage(RequestModel):
    role: ChatRole
    content: str | Annotated[list[TextContentPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    name: str | None = None
    # An assistant turn's calls.
    tool_calls: Annotated[list[MessageToolCall], Field(max_length=MAX_MESSAGE_TOOL_CALLS)] | None = None
    tool_call_id: str | None = None  # a tool result: the call it answers

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        # Only an assistant turn may omit content (OpenAI allows it alongside tool calls).
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for a '{self.role}' message")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("tool_call_id is required for a 'tool' message")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an 'assistant' message may have tool_calls")
        return self

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates expect it: `developer` is OpenAI's new name for
        `system`; tool calls and the id a tool result answers are passed on."""
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": None if self.content is None and self.tool_calls else self.text,
        }
        if self.tool_calls:
            message["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message

    @property
    def text(self) -> str:
        """The message as plain text; text parts are joined with newlines, as vLLM does."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: Annotated[list[ToolDefinition], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # Extra variables for the chat template (vLLM's), e.g. {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = Field(None, max_length=MAX_TEMPLATE_KWARGS)
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT, description="Deprecated by OpenAI for max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("tools")
    @classmethod
    def _distinct_tool_names(cls, value: list[ToolDefinition] | None) -> Any:
        names = [tool.function.name for tool in value or []]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"tool names must be unique; {', '.join(duplicated)} appears more than once")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_needs_its_tool(cls, value: ToolChoice | None, info: ValidationInfo) -> Any:
        tools: list[ToolDefinition] = info.data.get("tools") or []
        if value in (None, "none", "auto"):
            return value
        if not tools:
            raise ValueError("'tool_choice' is only allowed when 'tools' are specified")
        if isinstance(value, NamedToolChoice) and value.function.name not in {t.function.name for t in tools}:
            raise ValueError(f"tool '{value.function.name}' is not one of the request's tools")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("logprobs", False):
            raise ValueError("top_logprobs requires logprobs to be true")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        """The client's output limit, or None to let the caller fill the context."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        return [message.template_dict() for message in self.messages]

    @property
    def effective_tool_choice(self) -> str | NamedToolChoice:
        """OpenAI's default: `auto` when tools are given, `none` otherwise."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def to_sampling_params(self, max_tokens: int) -> SamplingParams:
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling_params(max_tokens, logprobs)
