"""Streaming chunk JSON, built as strings: the per-token hot path.

Owns the exact JSON of each streamed chunk, to the shapes of OpenAI's `chat.completion.chunk` and
`text_completion` objects. An encoder is made once per stream and pre-renders
everything that does not change (id, created, model, the `usage` tail), so a token costs one
string escape and a concatenation, several times cheaper than a pydantic dump.
It returns the JSON only; SSE framing (`data: ...`) belongs to the SSE module.

Shapes, as OpenAI sends them:
  chat:       {"id","object":"chat.completion.chunk","created","model",
               "choices":[{"index","delta":{...},"logprobs":null,"finish_reason":null}]}
  completion: {"id","object":"text_completion","created","model",
               "choices":[{"index","text","logprobs":null,"finish_reason":null}]}
With include_usage every chunk also has `"usage":null`, and a final chunk has `"choices":[]`
and the usage. NOTE: `system_fingerprint` is optional in OpenAI's schema and omitted here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.openai.usage import Usage

# One shared encoder: `json.dumps` with non-default options builds a new encoder per call.
encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

# JSON has no -Infinity; OpenAI-compatible servers (vLLM) report impossible tokens as -9999.
MIN_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    return logprob if logprob > MIN_LOGPROB else MIN_LOGPROB  # also maps NaN to the floor


def chat_logprob_entry(
    token: str,
    logprob: float,
    top: Sequence[tuple[str, float]] = (),
    token_bytes: bytes | None = None,
) -> dict[str, Any]:
    """One element of chat `logprobs.content`. `token_bytes` defaults to the token's UTF-8."""
    return {
        "token": token,
        "logprob": _finite(logprob),
        "bytes": list(token.encode() if token_bytes is None else token_bytes),
        "top_logprobs": [
            {"token": alt, "logprob": _finite(alt_logprob), "bytes": list(alt.encode())} for alt, alt_logprob in top
        ],
    }


def completion_logprobs(
    tokens: Sequence[str],
    token_logprobs: Sequence[float],
    top_logprobs: Sequence[Sequence[tuple[str, float]]] | None,
    text_offsets: Sequence[int],
) -> dict[str, Any]:
    """Legacy completion `logprobs`: parallel lists, one entry per token."""
    return {
        "tokens": list(tokens),
        "token_logprobs": [_finite(logprob) for logprob in token_logprobs],
        "top_logprobs": None
        if top_logprobs is None
        else [{alt: _finite(alt_logprob) for alt, alt_logprob in top} for top in top_logprobs],
        "text_offset": list(text_offsets),
    }


def _usage_json(usage: Usage) -> str:
    return usage.model_dump_json()


class ChunkEncoder:
    """What every OpenAI chunk shares: id, object, created, model, the choices, the usage tail.
    Each protocol's encoder adds its choices' shapes (app/chat/encoder.py, app/completions/chunks.py)."""

    def __init__(self, *, object_name: str, completion_id: str, model: str, created: int, include_usage: bool) -> None:
        self._head = (
            f'{{"id":{encode(completion_id)},"object":"{object_name}",'
            f'"created":{int(created)},"model":{encode(model)},"choices":['
        )
        self.include_usage = include_usage
        self._tail = '],"usage":null}' if include_usage else "]}"
        self._usage_head = self._head + '],"usage":'

    def usage(self, usage: Usage) -> str:
        """The final usage chunk: no choices, only the usage (sent when include_usage is on)."""
        return f"{self._usage_head}{_usage_json(usage)}}}"

    def _chunk(self, choice: str) -> str:
        return self._head + choice + self._tail
