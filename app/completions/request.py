"""The legacy completions request body: one prompt or several, as text or token ids, on top of the
sampling fields OpenAI's generation requests share (app/openai/requests.py)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from app.openai.limits import MAX_INT, MAX_PROMPTS, MAX_SEQUENCES
from app.openai.requests import SamplingRequest, TokenId
from models import MAX_TOP_LOGPROBS, SamplingParams

# Legacy completions default, as in OpenAI's API reference and vLLM.
DEFAULT_COMPLETION_MAX_TOKENS = 16

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
