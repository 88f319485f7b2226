"""A streamed Message: Anthropic's events, each on an `event:` line with its JSON.

`message_start` (the message with empty content and the input's usage) and a `ping` open the
stream with the first tokens; then each content block in turn: `content_block_start`, its
`content_block_delta`s (`text_delta`, `thinking_delta`, or a tool call's `input_json_delta`) and
`content_block_stop`; then `message_delta` (the stop reason and the output's usage) and
`message_stop`. After an engine error: an `error` event, as Anthropic's API sends mid-stream.
Text that is only whitespace between a model's calls opens no text block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.anthropic.output import message, new_id, stop_reason, usage
from app.generation.sse import event
from app.openai import Usage
from app.reasoning import ReasoningDelta
from app.reply_stream import Piece, ReplyStream
from app.tools.calls import CallStart, ContentDelta
from app.tools.choice import ToolPlan
from middleware.edge.error_shape import anthropic_error
from models import FinishReason, RequestOutput

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class MessageEvents:
    def __init__(
        self,
        model: str,
        num_prompt_tokens: int,
        plan: ToolPlan | None,
        reasoning: bool | None,
        stop_sequences: Sequence[str] = (),
    ) -> None:
        self.id = new_id("msg")
        self._model = model
        self._num_prompt_tokens = num_prompt_tokens
        self._reply = ReplyStream(reasoning, plan)
        self._block: str | None = None  # the open block's type
        self._index = -1
        self._whitespace = ""
        self._num_calls = 0
        self._finish: FinishReason | None = None
        self._matched: str | int | None = None  # the stop string or token that ended the reply
        self._stop_sequences = stop_sequences

    # --- StreamRenderer ---------------------------------------------------------------------

    def opening(self, num_choices: int) -> bytes:
        start = message(self.id, self._model, [], usage=usage(self._num_prompt_tokens, 1, 0))
        return self._event("message_start", message=start) + self._event("ping")

    def render(self, index: int, output: RequestOutput) -> bytes:
        parts = [self._piece(piece) for piece in self._reply.push(output.text, output.finished)]
        if output.finished:
            self._finish = output.finish_reason
            self._matched = output.stop_reason
            if self._index < 0:  # an empty reply is still one (empty) text block
                parts.append(self._open("text", {"type": "text", "text": ""}))
            parts.append(self._close())
        return b"".join(parts)

    def failure(self, message: str, kind: str) -> bytes:
        status = 400 if kind == "invalid_request_error" else 500
        return b"event: error\n" + event(anthropic_error(status, message).decode())

    def ending(self, totals: Usage) -> bytes:
        reason, sequence = stop_reason(self._finish, self._num_calls, self._matched, self._stop_sequences)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        cached = totals.prompt_tokens_details.cached_tokens
        final = usage(totals.prompt_tokens, totals.completion_tokens, cached)
        return self._event("message_delta", delta=delta, usage=final) + self._event("message_stop")

    # --- pieces -----------------------------------------------------------------------------

    def _piece(self, piece: Piece) -> bytes:
        if isinstance(piece, ReasoningDelta):
            opened = self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            return opened + self._delta({"type": "thinking_delta", "thinking": piece.text})
        if isinstance(piece, ContentDelta):
            if self._block != "text":
                if not (self._whitespace + piece.text).strip():
                    self._whitespace += piece.text
                    return b""
                text, self._whitespace = self._whitespace + piece.text, ""
                return self._open("text", {"type": "text", "text": ""}) + self._delta(
                    {"type": "text_delta", "text": text}
                )
            return self._delta({"type": "text_delta", "text": piece.text})
        if isinstance(piece, CallStart):
            self._num_calls += 1
            block = {"type": "tool_use", "id": "toolu" + piece.id.removeprefix("call"), "name": piece.name, "input": {}}
            return self._open("tool_use", block, force=True)
        return self._delta({"type": "input_json_delta", "partial_json": piece.text})

    def _open(self, kind: str, block: dict[str, Any], *, force: bool = False) -> bytes:
        if self._block == kind and not force:
            return b""
        closed = self._close()
        self._block, self._index = kind, self._index + 1
        return closed + self._event("content_block_start", index=self._index, content_block=block)

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        signature = self._block == "thinking"
        self._block = None
        # Anthropic ends a thinking block with its signature; surge's thinking is its own, unsigned.
        closing = self._delta({"type": "signature_delta", "signature": ""}) if signature else b""
        return closing + self._event("content_block_stop", index=self._index)

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event("content_block_delta", index=self._index, delta=delta)

    def _event(self, kind: str, **fields: Any) -> bytes:
        return b"event: " + kind.encode() + b"\n" + event(_encode({"type": kind, **fields}))
