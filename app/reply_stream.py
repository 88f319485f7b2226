"""A reply's text as it streams, split into reasoning, content and tool-call pieces: what every
protocol's stream renders (chat chunks, Responses events, Anthropic blocks).

Reasoning is split off first (app/reasoning.py), then, with tools, the content goes through the
model family's call parser (app/tools/); a whole reply is the same stream run over it.
"""

from __future__ import annotations

from app.reasoning import ReasoningDelta, ReasoningStream
from app.tools.call_stream import ToolCallStream
from app.tools.calls import ArgumentsDelta, CallStart, ContentDelta
from app.tools.choice import ToolPlan

Piece = ReasoningDelta | ContentDelta | CallStart | ArgumentsDelta


class ReplyStream:
    def __init__(self, reasoning: bool | None, plan: ToolPlan | None) -> None:
        """reasoning: None for a model that does not reason, else whether the reply starts inside
        a reasoning block (the prompt opened it)."""
        self._reasoning = ReasoningStream(in_reasoning=reasoning) if reasoning is not None else None
        self._tools: ToolCallStream | None = plan.format.stream() if plan is not None else None

    def push(self, text: str, finished: bool) -> list[Piece]:
        """The pieces of the next `text`; with `finished`, whatever the parsers still held."""
        text_pieces: list[ReasoningDelta | ContentDelta] = []
        if self._reasoning is None:
            if text:
                text_pieces.append(ContentDelta(text))
        else:
            text_pieces = list(self._reasoning.push(text)) if text else []
            if finished:
                text_pieces += self._reasoning.end()
        if self._tools is None:
            return list(text_pieces)
        pieces: list[Piece] = []
        for piece in text_pieces:
            pieces += [piece] if isinstance(piece, ReasoningDelta) else self._tools.push(piece.text)
        if finished:
            pieces += self._tools.end()
        return pieces
