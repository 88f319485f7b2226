"""Every chunk of one streamed chat completion as JSON text: OpenAI's `chat.completion.chunk`.

Built as strings on the per-token path (app/openai/chunks.py says why and gives the shapes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.openai.chunks import ChunkEncoder, encode


def _chat_logprobs_json(logprobs: Sequence[dict[str, Any]] | None) -> str:
    return "null" if logprobs is None else f'{{"content":{encode(logprobs)},"refusal":null}}'


class ChatChunkEncoder(ChunkEncoder):
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
        delta = "{}" if text is None else f'{{"content":{encode(text)}}}'
        logprobs_json = _chat_logprobs_json(logprobs)
        finish_json = "null" if finish_reason is None else encode(finish_reason)
        return self._chunk(
            f'{{"index":{index},"delta":{delta},"logprobs":{logprobs_json},"finish_reason":{finish_json}}}'
        )

    def reasoning(self, index: int, text: str, *, logprobs: Sequence[dict[str, Any]] | None = None) -> str:
        """Reasoning text (vLLM's `delta.reasoning_content`)."""
        logprobs_json = _chat_logprobs_json(logprobs)
        return self._chunk(
            f'{{"index":{index},"delta":{{"reasoning_content":{encode(text)}}},"logprobs":{logprobs_json},'
            '"finish_reason":null}'
        )

    def tool_calls(
        self, index: int, calls: Sequence[dict[str, Any]], *, logprobs: Sequence[dict[str, Any]] | None = None
    ) -> str:
        """Fragments of tool calls, in OpenAI's delta format (app/chat/chunks.py builds them)."""
        logprobs_json = _chat_logprobs_json(logprobs)
        return self._chunk(
            f'{{"index":{index},"delta":{{"tool_calls":{encode(calls)}}},"logprobs":{logprobs_json},'
            '"finish_reason":null}'
        )
