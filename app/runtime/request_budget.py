"""What one request may ask of the server over all its sequences: tokens of work and of output.

The caps on `n`, prompts and sequences (app/openai/limits.py) bound how many sequences a request
starts, not how much each does: 256 sequences of a full context are a million tokens of prefill
and decode from one request, and `n` x `max_tokens` x `top_logprobs` a reply of ~100 MB built
whole in memory when it is not streamed. TPM limits (when on) bound a key's tokens per minute;
this bounds one request, with or without them:

- work: prompt tokens x `n` + `max_tokens` x sequences (the engine's prefill and decode);
- output: `max_tokens` x sequences x (1 + `top_logprobs`), each alternative counted like a token
  (what the reply holds: ~1.7 KB of JSON per token at 20 alternatives).

An explicit `max_tokens` past either is a 400 naming both numbers. A `max_tokens` left out
(OpenAI's "up to the context") is lowered to fit instead, as vLLM derives its default from the
context: the request still runs, within what the server allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.config.settings import Settings
from middleware.errors import invalid_request

# Work per request by default: this many full contexts (a full-length prompt with n = 16 and a
# batch of 128 prompts of 1,000 tokens both fit).
DEFAULT_CONTEXTS_PER_REQUEST = 32
# The default body limit follows from the work budget: this many bytes per token of it (a token is
# ~4 characters of English, ~7 bytes as a JSON token id, at most ~12 as escaped JSON: \ud83d\ude00),
# within these bounds. The JSON parse runs on the event loop: ~9 ms a megabyte.
BODY_BYTES_PER_TOKEN = 16
MIN_BODY_BYTES = 1024 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RequestBudget:
    tokens: int
    output: int

    @classmethod
    def of(cls, settings: Settings, max_model_len: int) -> RequestBudget:
        tokens = settings.max_request_tokens or DEFAULT_CONTEXTS_PER_REQUEST * max_model_len
        return cls(tokens=tokens, output=settings.max_request_output_tokens)

    @property
    def body_bytes(self) -> int:
        """The largest request body that a request within the work budget needs."""
        return min(MAX_BODY_BYTES, max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * self.tokens))

    def fit(
        self,
        *,
        prompt_lens: Sequence[int],
        n: int,
        max_tokens: int,
        is_explicit: bool,
        top_logprobs: int | None,
        param: str,
    ) -> int:
        """`max_tokens` if the request fits; lowered to fit when it was left out; else a 400."""
        sequences = len(prompt_lens) * n
        prompt_work = sum(prompt_lens) * n
        per_token = 1 + (top_logprobs or 0)
        fits = min((self.tokens - prompt_work) // sequences, self.output // (sequences * per_token))
        if max_tokens <= fits:
            return max_tokens
        if not is_explicit and fits >= 1:
            return fits
        work = prompt_work + max_tokens * sequences
        if work > self.tokens:
            raise invalid_request(
                f"This request asks for up to {work} tokens ({sum(prompt_lens)} prompt tokens x {n} choices, "
                f"{max_tokens} completion tokens x {sequences} sequences); the server allows {self.tokens} "
                f"per request. Reduce n, max_tokens or the {param}.",
                param="max_tokens" if is_explicit else param,
            )
        raise invalid_request(
            f"This request asks for up to {max_tokens * sequences * per_token} output tokens and log "
            f"probabilities ({max_tokens} tokens x {sequences} sequences x {per_token}); the server allows "
            f"{self.output} per request. Reduce n, max_tokens or top_logprobs.",
            param="max_tokens",
        )
