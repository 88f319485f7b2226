"""Hermes / Qwen2.5 / Qwen3 tool calls: a JSON object between `<tool_call>` and `</tool_call>`.

    Let me check.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Text around the calls is content. A tag that opens no valid call (no JSON object, no name) stays
in the content as written; a closing tag the model left out is forgiven.
"""

from __future__ import annotations

from app.tools.call_stream import FormatStream
from app.tools.calls import StreamEvent

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class HermesStream(FormatStream):
    def __init__(self) -> None:
        super().__init__()
        self._closing = False  # the call's object is complete: the closing tag may follow

    def _step(self, events: list[StreamEvent]) -> bool:
        if self._call is None:
            if not self._text_until(OPEN, events):
                return False
            self._start_call()
            return True
        if self._closing:
            return self._close(events)
        self._feed(events)
        if self._call.scanner.failed:
            self._abandon(events)
            return True
        if self._call.scanner.done:
            self._closing = True
            return True
        return False

    def _unclaimed(self) -> str:
        return OPEN + self._call.raw if self._call is not None else ""

    def _close(self, events: list[StreamEvent]) -> bool:
        """After a call's object: whitespace, then the closing tag (or none: the model forgot it)."""
        stripped = self._pending.lstrip()
        if not stripped or (CLOSE.startswith(stripped) and stripped != CLOSE):
            return False  # the tag may still come
        if stripped.startswith(CLOSE):
            stripped = stripped[len(CLOSE) :]
        closing = self._pending[: len(self._pending) - len(stripped)]
        self._pending = stripped
        assert self._call is not None
        if self._call.started:
            self._finish_call(events)
        else:  # a complete object with no name: not a call, content as written
            self._emit(OPEN + self._call.raw + closing, events)
            self._call = None
        self._closing = False
        return True

    def _abandon(self, events: list[StreamEvent]) -> None:
        """The call's text is not a call: it is content, tag included (unless its name went out)."""
        assert self._call is not None
        if self._call.started:
            self._finish_call(events)
        else:
            # Sent as text now, so the tag is not taken for an opening one again.
            self._emit(OPEN, events)
            self._pending = self._call.raw + self._pending
            self._call = None
        self._closing = False
