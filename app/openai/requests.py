"""OpenAI request bodies for /v1/chat/completions and /v1/completions.

Owns validation of what clients send and its translation into the engine's `SamplingParams`.
Everything a client can get wrong is checked here, so it becomes a 400 naming the field rather
than a 500 from deep inside the engine. What needs the model (context length, vocabulary size,
tokenizing the prompt) is the caller's job.

Deliberate choices, with reasons:
- Unknown fields are ignored, as OpenAI and vLLM do, so newer clients keep working.
- `null` means "use the default" for every field: OpenAI documents nearly all of them as
  nullable, and SDKs send explicit nulls.
- `top_p=0` means greedy: the nucleus of mass 0 is the single most likely token. (The engine
  requires `top_p > 0`, so it is mapped to `temperature=0`.)
- `top_k` follows vLLM: 0 or -1 means off.
- Empty stop strings are dropped: they would stop every request before its first token.
- Chat `max_completion_tokens` wins over the deprecated `max_tokens` when both are sent (vLLM).
- Completions' `echo=true` is rejected: echoing with logprobs needs prompt logprobs, which the
  engine does not compute, and half-supporting it would give wrong answers to eval harnesses.
- Completions' `suffix` (insertion) is rejected: no model we serve does fill-in-the-middle.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from app.openai.base import RequestModel
from app.openai.limits import (
    MAX_CHOICES,
    MAX_CONTENT_PARTS,
    MAX_INT,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_MESSAGE_TOOL_CALLS,
    MAX_MESSAGES,
    MAX_PROMPTS,
    MAX_SEQUENCES,
    MAX_STOP_LENGTH,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPLATE_KWARGS,
    MAX_TOOLS,
)
from app.openai.tools import MessageToolCall, NamedToolChoice, ToolChoice, ToolDefinition
from middleware.admission.priority import MAX_PRIORITY
from models import MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, SamplingParams

MAX_LOGIT_BIAS = 100.0
# Longer logit_bias keys are no token id of any vocabulary (and past 4300 digits int() refuses them).
MAX_TOKEN_ID_DIGITS = 20
# torch.Generator.manual_seed accepts exactly this range; outside it the engine would fail.
MIN_SEED = -(2**63)
MAX_SEED = 2**64 - 1
# Legacy completions default, as in OpenAI's API reference and vLLM.
DEFAULT_COMPLETION_MAX_TOKENS = 16

TokenId = Annotated[int, Field(ge=0, le=MAX_INT)]
StopString = Annotated[str, Field(max_length=MAX_STOP_LENGTH)]


class StreamOptions(RequestModel):
    include_usage: bool = False


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


class JsonSchemaFormat(RequestModel):
    """`response_format.json_schema`: OpenAI's structured outputs."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    # `schema` would shadow a BaseModel attribute; sent and read as "schema". Absent: any JSON object.
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    # Enforced either way: surge constrains every json_schema reply (as vLLM does), strict or not.
    strict: bool | None = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_for_json_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type 'json_schema' needs a 'json_schema' object")
        return self


class SamplingRequest(RequestModel):
    """Fields shared by chat and legacy completions, in the order validators rely on."""

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS_ENTRIES)
    seed: int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    user: str | None = None
    # Extensions vLLM accepts.
    top_k: int | None = Field(None, ge=-1, le=MAX_INT)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    # Lower runs first, within the key's tier; below 0 only for keys allowed it (middleware/admission/priority.py).
    priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    # Chat's structured outputs; legacy completions take it too, as vLLM does.
    response_format: ResponseFormat | None = None

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, value: dict[str, float] | None) -> Any:
        for key, bias in (value or {}).items():
            # ASCII digits only: str.isdigit() is also true for "²" and other digits int() rejects.
            if not (key.isascii() and key.isdigit()) or len(key) > MAX_TOKEN_ID_DIGITS:
                raise ValueError(f"logit_bias keys must be token ids, got {key[:MAX_TOKEN_ID_DIGITS]!r}")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias for token {key} must be between -100 and 100, got {bias}")
        return value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(stop for stop in stops if stop)

    def _sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        is_top_p_greedy = self.top_p == 0.0
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if is_top_p_greedy else (1.0 if self.temperature is None else self.temperature),
            top_p=1.0 if self.top_p is None or is_top_p_greedy else self.top_p,
            top_k=max(self.top_k or 0, 0),
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias={int(key): bias for key, bias in (self.logit_bias or {}).items()},
            logprobs=logprobs,
            stop=self.stop_strings,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
        )


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


TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Prompt = str | list[str] | TokenIds | list[TokenIds]


_PROMPT_SHAPE = "prompt must be a string, a list of strings, a list of token ids or a list of such lists"


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in value)
    )


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    max_tokens: int | None = Field(DEFAULT_COMPLETION_MAX_TOKENS, ge=1, le=MAX_INT)
    # Legacy completions ask for the top N alternatives; OpenAI caps N at 5, vLLM at 20.
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt_shape(cls, value: Any) -> Any:
        # Checked up front: pydantic's errors for a four-way union name every branch.
        if isinstance(value, str):
            return value
        if not isinstance(value, list) or not value:
            raise ValueError(_PROMPT_SHAPE)
        if len(value) > MAX_PROMPTS and not isinstance(value[0], int):
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request, got {len(value)}")
        if all(isinstance(item, str) for item in value) or all(_is_token_ids(item) for item in value):
            return value
        if _is_token_ids(value):
            return value
        raise ValueError(_PROMPT_SHAPE)

    @model_validator(mode="after")
    def _bounded_sequences(self) -> CompletionRequest:
        num_sequences = len(self.prompt_inputs()) * self.n
        if num_sequences > MAX_SEQUENCES:
            raise ValueError(
                f"prompts x n is {num_sequences}; at most {MAX_SEQUENCES} sequences per request (send more requests)"
            )
        return self

    @field_validator("echo")
    @classmethod
    def _reject_echo(cls, value: bool) -> Any:
        if value:
            raise ValueError("echo is not supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _reject_suffix(cls, value: str | None) -> Any:
        if value:
            raise ValueError("suffix is not supported")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def prompt_inputs(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids. Choice `i*n + j` is prompt i's j-th sample."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt[0], int):  # one prompt as token ids; validation made all items ints
            return [prompt]
        return list(prompt)

    def to_sampling_params(self, max_tokens: int) -> SamplingParams:
        return self._sampling_params(max_tokens, self.logprobs)
