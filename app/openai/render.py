"""Engine outputs in OpenAI's words: finish reasons and logprobs, for JSON bodies and chunks alike.

What only Chat Completions says (tool calls, its finish with tools) is app/chat/render.py."""

from __future__ import annotations

from collections.abc import Sequence

from app.openai import chat_logprob_entry, completion_logprobs
from models import FinishReason, Tokenizer, TokenLogprob


def chat_logprobs_json(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob]) -> list[dict[str, object]]:
    return [
        chat_logprob_entry(
            tokenizer.token_text(lp.token_id),
            lp.logprob,
            [(tokenizer.token_text(alt), alt_lp) for alt, alt_lp in lp.top],
            token_bytes=tokenizer.token_bytes(lp.token_id),
        )
        for lp in logprobs
    ]


def finish_reason_text(reason: FinishReason | None) -> str | None:
    if reason is None:
        return None
    # abort/error never reach a client as a finish reason; report them as a plain stop.
    return reason.value if reason in (FinishReason.STOP, FinishReason.LENGTH) else "stop"


def completion_logprobs_json(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob], offset: int) -> dict[str, object]:
    """Legacy completion logprobs; `offset` is where the first token's text starts in the choice's text."""
    tokens = [tokenizer.token_text(lp.token_id) for lp in logprobs]
    offsets, position = [], offset
    for token in tokens:
        offsets.append(position)
        position += len(token)
    top = [[(tokenizer.token_text(alt), alt_lp) for alt, alt_lp in lp.top] for lp in logprobs]
    return completion_logprobs(tokens, [lp.logprob for lp in logprobs], top, offsets)
