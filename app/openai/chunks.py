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
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

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


def _chat_logprobs_json(logprobs: Sequence[dict[str, Any]] | None) -> str:
    return "null" if logprobs is None else f'{{"content":{_encode(logprobs)},"refusal":null}}'


class _ChunkEncoder:
    def __init__(self, *, object_name: str, completion_id: str, model: str, created: int, include_usage: bool) -> None:
        self._head = (
            f'{{"id":{_encode(completion_id)},"object":"{object_name}",'
            f'"created":{int(created)},"model":{_encode(model)},"choices":['
        )
        self._tail = '],"usage":null}' if include_usage else "]}"
        self._usage_head = self._head + '],"usage":'

    def usage(self, usage: Usage) -> str:
        """The final usage chunk: no choices, only the usage (sent when include_usage is on)."""
        return f"{self._usage_head}{_usage_json(usage)}}}"

    def _chunk(self, choice: str) -> str:
        return self._head + choice + self._tail


class ChatChunkEncoder(_ChunkEncoder):
    """Builds every chunk of one streamed chat completion."""

    def __init__(self, *, completion_id: str, model: str, created: int, include_usage: bool = False) -> None:
        super().__init__(
            object_name="chat.completion.chunk",
            completion_id=completion_id,
            model=model,
            created=created,
            include_usage=include_usage,
        )

    def role(self, index: int) -> str:
        """A choice's first chunk, as OpenAI sends it: the role and empty content."""
        return self._chunk(
            f'{{"index":{index},"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}'
        )

    def delta(
        self,
        index: int,
        text: str | None,
        *,
        logprobs: Sequence[dict[str, Any]] | None = None,
        finish_reason: str | None = None,
    ) -> str:
        """A chunk of text (None: an empty delta, e.g. for the finish), with the logprobs of
        its tokens as built by `chat_logprob_entry`."""
        delta = "{}" if text is None else f'{{"content":{_encode(text)}}}'
        logprobs_json = _chat_logprobs_json(logprobs)
        finish_json = "null" if finish_reason is None else _encode(finish_reason)
        return self._chunk(
            f'{{"index":{index},"delta":{delta},"logprobs":{logprobs_json},"finish_reason":{finish_json}}}'
        )

    def reasoning(self, index: int, text: str, *, logprobs: Sequence[dict[str, Any]] | None = None) -> str:
        """Reasoning text (vLLM's `delta.reasoning_content`)."""
        logprobs_json = _chat_logprobs_json(logprobs)
        return self._chunk(
            f'{{"index":{index},"delta":{{"reasoning_content":{_encode(text)}}},"logprobs":{logprobs_json},'
            '"finish_reason":null}'
        )

    def tool_calls(
        self, index: int, calls: Sequence[dict[str, Any]], *, logprobs: Sequence[dict[str, Any]] | None = None
    ) -> str:
        """Fragments of tool calls, in OpenAI's delta format (app/chat/chunks.py builds them)."""
        logprobs_json = _chat_logprobs_json(logprobs)
        return self._chunk(
            f'{{"index":{index},"delta":{{"tool_calls":{_encode(calls)}}},"logprobs":{logprobs_json},'
            '"finish_reason":null}'
        )


class CompletionChunkEncoder(_ChunkEncoder):
    """Builds every chunk of one streamed legacy completion."""

    def __init__(self, *, completion_id: str, model: str, created: int, include_usage: bool = False) -> None:
        super().__init__(
            object_name="text_completion",
            completion_id=completion_id,
            model=model,
            created=created,
            include_usage=include_usage,
        )

    def text(
        self,
        index: int,
        text: str,
        *,
        logprobs: dict[str, Any] | None = None,
        finish_reason: str | None = None,
    ) -> str:
        """A chunk of text, with logprobs as built by `completion_logprobs`."""
        logprobs_json = "null" if logprobs is None else _encode(logprobs)
        finish_json = "null" if finish_reason is None else _encode(finish_reason)
        return self._chunk(
            f'{{"index":{index},"text":{_encode(text)},"logprobs":{logprobs_json},"finish_reason":{finish_json}}}'
        )
