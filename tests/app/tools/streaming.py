"""Helpers for the tool-call parser tests: a reply fed in pieces, joined back into a reply."""

from __future__ import annotations

import random

from app.tools.calls import ArgumentsDelta, CallStart, ContentDelta, ParsedReply, StreamEvent, ToolCall
from app.tools.formats import ToolFormat


def joined(events: list[StreamEvent]) -> ParsedReply:
    """What a client assembling OpenAI's deltas ends up with: calls by index, the first fragment
    of each (id and name) before any of its arguments."""
    content = "".join(event.text for event in events if isinstance(event, ContentDelta))
    by_index: dict[int, ToolCall] = {}
    for event in events:
        if isinstance(event, CallStart):
            assert event.index == len(by_index), "calls are announced in order, once each"
            by_index[event.index] = ToolCall(event.name, "", event.id)
        elif isinstance(event, ArgumentsDelta):
            by_index[event.index].arguments += event.text  # KeyError: arguments before the call's start
    calls = [by_index[i] for i in sorted(by_index)]
    return ParsedReply(content if content or not calls else None, calls)


def streamed(fmt: ToolFormat, pieces: list[str]) -> ParsedReply:
    stream = fmt.stream()
    events = [event for piece in pieces for event in stream.push(piece)]
    return joined(events + stream.end())


def splits(text: str, seed: int) -> list[list[str]]:
    """The text one character at a time, and cut at random points (as tokens would cut it)."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 12))) if len(text) > 1 else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return [list(text), pieces, [text]]


def shape(reply: ParsedReply) -> tuple[str | None, list[tuple[str, str]]]:
    """A reply without the random call ids."""
    return reply.content, [(call.name, call.arguments) for call in reply.calls]
