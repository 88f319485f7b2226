"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole reply is one or more call objects.

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}

A reply is calls when it starts (after whitespace, and `<|python_tag|>` when the decoder keeps
it) with `{`; several are separated by `;`. Anything else is plain content, as is a reply whose
first object is no call. Text after the calls is content too: a reply never loses text.
"""

from __future__ import annotations

from app.tools.call_stream import FormatStream
from app.tools.calls import StreamEvent

PYTHON_TAG = "<|python_tag|>"


class Llama3Stream(FormatStream):
    def __init__(self) -> None:
        super().__init__()
        self._mode = "start"  # start | call | between | text

    def _step(self, events: list[StreamEvent]) -> bool:
        """Advance one mode on the pending text; False when waiting for more."""
        stripped = self._pending.lstrip()
        if self._mode == "start":
            if not stripped or (PYTHON_TAG.startswith(stripped) and stripped != PYTHON_TAG):
                return False
            if stripped.startswith(PYTHON_TAG):
                stripped = stripped[len(PYTHON_TAG) :].lstrip()
                if not stripped:
                    self._pending = ""
                    return False
            return self._call_or_text(stripped)
        if self._mode == "call":
            outcome = self._read_call(events)
            if outcome != "wait":
                self._mode = "between" if outcome == "call" else "text"
            return outcome != "wait"
        if self._mode == "between":
            if not stripped:
                return False
            if stripped.startswith(";"):
                stripped = stripped[1:].lstrip()
                if not stripped:
                    self._pending = ";"  # the next call's brace decides
                    return False
            return self._call_or_text(stripped)
        self._emit(self._pending, events)
        self._pending = ""
        return False

    def _call_or_text(self, stripped: str) -> bool:
        """At the start or after a call: a brace opens a call, anything else is content."""
        if stripped.startswith("{"):
            self._pending = stripped
            self._content.call()
            self._start_call()
            self._mode = "call"
        else:
            self._mode = "text"
            if self._num_calls:
                self._pending = stripped
        return True
