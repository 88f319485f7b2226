"""Checks of a generation request against the served model, before anything is spent.

Every error that can be known before generation (unknown model, context overflow, a token id
outside the vocabulary, an empty prompt) is raised here, before a stream opens, so it reaches
the client with its proper status. What needs no model (field types, ranges) is the schemas'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from app.config.settings import Settings
from app.runtime.request_budget import RequestBudget
from middleware.errors import invalid_request
from models import AsyncEngine, SamplingParams


class GenerationRequest(Protocol):
    """What `sampling_params` asks of a protocol's request (each protocol's body is one)."""

    @property
    def n(self) -> int: ...

    @property
    def logit_bias(self) -> dict[str, float] | None: ...

    @property
    def stop_token_ids(self) -> list[int] | None: ...

    def to_sampling_params(self, max_tokens: int) -> SamplingParams: ...


class OneChoice:
    """A `GenerationRequest`'s side for protocols with one choice and no logit biases (the
    Responses and Messages APIs)."""

    @property
    def n(self) -> int:
        return 1

    @property
    def logit_bias(self) -> dict[str, float] | None:
        return None

    @property
    def stop_token_ids(self) -> list[int] | None:
        return None


def check_template_variables(engine: AsyncEngine, variables: Mapping[str, Any] | None) -> None:
    """`chat_template_kwargs` may not set what the renderer provides (`messages`, `tools`, the
    special tokens such as `bos_token`): set from a request, a special token would be written by
    the template as a real control token, and the others would replace the conversation."""
    reserved = sorted(engine.tokenizer.reserved_template_variables.intersection(variables or {}))
    if reserved:
        raise invalid_request(
            f"chat_template_kwargs may not set '{reserved[0]}': the server provides it to the chat template.",
            param=f"chat_template_kwargs.{reserved[0]}",
        )


# Texts longer than max_model_len x this many characters are first measured on a prefix that
# long; a token of any tokenizer we know covers far fewer characters on average.
PREFIX_CHARS_PER_TOKEN = 16
# How many tokens a text's count can change by when it is cut short or tokenized alone instead
# of inside its chat template (a token merging across either end, a BOS).
BOUNDARY_TOKENS = 8
# Shorter texts are measured together, as one text: one by one they would add next to nothing
# to the bound (and 10,000 of them would slip past it).
MIN_MEASURED_CHARS = 64
# Request bodies larger than this have their prompts rendered and tokenized on a worker thread:
# the tiny model's tokenizer takes ~0.5 s a megabyte, time every other stream and /health would
# wait on the event loop (64 KB: ~20 ms).
OFF_LOOP_BYTES = 65_536

T = TypeVar("T")


async def tokenize_sized(body_bytes: int, work: Callable[[], T]) -> T:
    """`work()` (render, check, tokenize) inline for a small body, on a worker thread for a large one."""
    if body_bytes > OFF_LOOP_BYTES:
        return await asyncio.to_thread(work)
    return work()


def check_text_fits(engine: AsyncEngine, texts: Sequence[str], param: str) -> None:
    """Reject a prompt too long for the context before tokenizing all of it.

    Tokenizing costs about a second per megabyte: a prompt of several megabytes would take that
    long only to be refused (the callers run this on a worker thread for a large body). When the
    texts are long, each (the short ones joined as one) is tokenized up to a prefix of
    max_model_len x PREFIX_CHARS_PER_TOKEN characters; the counts, less BOUNDARY_TOKENS each, are
    a lower bound of the whole prompt's length, so a prompt refused here would have been refused
    after tokenizing it whole. Otherwise the caller
    tokenizes as usual and `sampling_params` checks the exact length.
    """
    max_model_len = engine.config.scheduler.max_model_len
    budget = max_model_len * PREFIX_CHARS_PER_TOKEN
    if sum(len(text) for text in texts) <= budget:
        return
    num_tokens = 0
    measured = [text for text in texts if len(text) >= MIN_MEASURED_CHARS]
    short = [text for text in texts if len(text) < MIN_MEASURED_CHARS]
    if short:
        measured.append("\n".join(short))
    for text in measured:
        num_tokens += max(0, len(engine.tokenizer.encode(text[:budget])) - BOUNDARY_TOKENS)
        if num_tokens >= max_model_len:
            raise invalid_request(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"at least {num_tokens} tokens in the {param}. Please reduce the length of the {param}.",
                param=param,
                code="context_length_exceeded",
            )


def sampling_params(
    engine: AsyncEngine,
    settings: Settings,
    request: GenerationRequest,
    prompt_lens: Sequence[int],
    requested_max_tokens: int | None,
    param: str,
) -> list[SamplingParams]:
    """One SamplingParams per choice, checked against the context length, the vocabulary and the
    request budget (app/runtime/request_budget.py). The longest prompt decides whether max_tokens fits
    the context (and its default, when left out)."""
    max_model_len = engine.config.scheduler.max_model_len
    prompt_len = max(prompt_lens)
    if prompt_len == 0:
        raise invalid_request("The prompt is empty.", param=param)
    if prompt_len >= max_model_len or (
        requested_max_tokens is not None and prompt_len + requested_max_tokens > max_model_len
    ):
        asked = requested_max_tokens or 1
        raise invalid_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + asked} tokens ({prompt_len} in the {param}, {asked} in the completion). "
            f"Please reduce the length of the {param} or completion.",
            param=param,
            code="context_length_exceeded",
        )
    max_tokens = requested_max_tokens if requested_max_tokens is not None else max_model_len - prompt_len
    vocab_size = engine.tokenizer.vocab_size
    for name, token_ids in (
        ("logit_bias", [int(key) for key in request.logit_bias or {}]),
        ("stop_token_ids", request.stop_token_ids or []),
    ):
        for token_id in token_ids:
            if token_id >= vocab_size:
                raise invalid_request(f"Token id {token_id} is out of vocabulary (size {vocab_size}).", param=name)
    try:
        base = request.to_sampling_params(max_tokens)
    except ValueError as exc:
        raise invalid_request(str(exc)) from exc
    fitted = RequestBudget.of(settings, max_model_len).fit(
        prompt_lens=prompt_lens,
        n=request.n,
        max_tokens=max_tokens,
        is_explicit=requested_max_tokens is not None,
        top_logprobs=base.logprobs,
        param=param,
    )
    if fitted != max_tokens:
        base = replace(base, max_tokens=fitted)
    if request.n == 1:
        return [base]
    # Each choice is its own sample; with a seed, choice i uses seed + i so all differ yet repeat.
    return [replace(base, seed=None if base.seed is None else base.seed + i) for i in range(request.n)]
