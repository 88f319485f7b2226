"""What a tool-call parser produces: whole replies split into content and calls, and stream events.

A call's `arguments` is the model's own text of the arguments object, unchanged: the streamed
fragments of a call join to exactly the `arguments` of the same reply parsed whole, and a client
that parses it gets what the model wrote (OpenAI's `arguments` is also a JSON string).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field


def new_call_id() -> str:
    """OpenAI's shape: `call_` and 24 random alphanumerics."""
    return "call_" + secrets.token_hex(12)


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, "{}" when the model gave none
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True, slots=True)
class ParsedReply:
    content: str | None  # None when the reply is only calls (OpenAI's `content: null`)
    calls: list[ToolCall]


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """A call's first fragment: OpenAI sends its index, id, type, name and `arguments: ""`."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    index: int
    text: str


StreamEvent = ContentDelta | CallStart | ArgumentsDelta
