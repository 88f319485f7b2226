"""The Responses API request body: every field real clients send is accepted.

Codex, the openai Agents SDK and LangChain send fields a local server cannot act on (`store`,
`include`, `prompt_cache_key`, `client_metadata`, `service_tier`, `reasoning.summary`, ...): each is
accepted and echoed where the Response object has a place for it, never a 400. Only values surge
cannot honour in any way get one, naming the field: image and file inputs (a text model), an
unknown `truncation`, `background: true` with `stream: true` or without `store`. Bounds follow the chat body's
(app/openai/limits.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from app.generation.validation import OneChoice
from app.openai.base import CacheSalted, RequestModel
from app.openai.limits import MAX_INT, MAX_MESSAGES, MAX_TOOLS
from middleware.admission.priority import MAX_PRIORITY
from models import MAX_TOP_LOGPROBS, SamplingParams

# A namespace group counts each of its functions against MAX_TOOLS; the groups themselves too.
MAX_TOOL_ENTRIES = MAX_TOOLS
MAX_METADATA_ENTRIES = 16


class TextFormat(RequestModel):
    """`text.format`: `text`, `json_object`, or `json_schema` with its fields flat (not nested as
    in chat's `response_format.json_schema`)."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = Field(None, pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(RequestModel):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(RequestModel):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(OneChoice, CacheSalted, RequestModel):
    model: str
    # The bound is the list's (a string input is bounded by the body and the context, as chat's).
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)] = ""
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_INT)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOL_ENTRIES)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = Field(None, ge=1, le=MAX_INT)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA_ENTRIES)
    user: str | None = None
    safety_identifier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None
    include: list[str] | None = Field(None, max_length=64)
    service_tier: str | None = None
    # Lower runs first, within the key's tier (as chat's; a surge extension).
    priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    # vLLM's extension, as chat's: generate until max_output_tokens whatever the model says.
    ignore_eos: bool = False

    def to_sampling_params(self, max_tokens: int) -> SamplingParams:
        is_top_p_greedy = self.top_p == 0.0
        include = self.include or ()
        logprobs = (self.top_logprobs or 0) if "message.output_text.logprobs" in include else None
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if is_top_p_greedy else (1.0 if self.temperature is None else self.temperature),
            top_p=1.0 if self.top_p is None or is_top_p_greedy else self.top_p,
            logprobs=logprobs,
            ignore_eos=self.ignore_eos,
            cache_salt=self.cache_salt or "",
        )
