"""The fields OpenAI's generation requests share (chat and legacy completions), and their checks.

Each protocol's own body is in its room: app/chat/request.py, app/completions/request.py.

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

from app.openai.base import CacheSalted, RequestModel
from app.openai.limits import (
    MAX_CHOICES,
    MAX_INT,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_LENGTH,
    MAX_STOP_TOKEN_IDS,
)
from middleware.admission.priority import MAX_PRIORITY
from models import MAX_STOP_STRINGS, SamplingParams

MAX_LOGIT_BIAS = 100.0
# Longer logit_bias keys are no token id of any vocabulary (and past 4300 digits int() refuses them).
MAX_TOKEN_ID_DIGITS = 20
# torch.Generator.manual_seed accepts exactly this range; outside it the engine would fail.
MIN_SEED = -(2**63)
MAX_SEED = 2**64 - 1

TokenId = Annotated[int, Field(ge=0, le=MAX_INT)]
StopString = Annotated[str, Field(max_length=MAX_STOP_LENGTH)]


class StreamOptions(RequestModel):
    include_usage: bool = False


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


class SamplingRequest(CacheSalted, RequestModel):
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

    def to_sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's view of this request, with `max_tokens` settled; each protocol's own."""
        raise NotImplementedError

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
            cache_salt=self.cache_salt or "",
        )
