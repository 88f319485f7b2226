"""Mistral tool calls after `[TOOL_CALLS]`, in both of Mistral's formats:

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]   (v3)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]other[ARGS]{}               (v11+)

Text before the tag is content. The v11 form is read by the same JSON call scanner, fed the
object it stands for (`{"name": NAME, "arguments": ARGS}`), so both forms stream alike.
`[CALL_ID]id` between the name and `[ARGS]` (tokenizer v13) is accepted and ignored.
"""

from __future__ import annotations

import json

from app.tools.call_stream import FormatStream
from app.tools.calls import StreamEvent

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


class MistralStream(FormatStream):
    def __init__(self) -> None:
        super().__init__()
        self._mode = "text"  # text | after_tag | array | array_between | name | args

    def _unclaimed(self) -> str:
        if self._mode == "name":
            return TOOL_CALLS
        return super()._unclaimed()

    def _step(self, events: list[StreamEvent]) -> bool:
        mode = self._mode
        if mode == "text":
            if not self._text_until(TOOL_CALLS, events):
                return False
            self._content.call()
            self._mode = "after_tag"
            return True
        if mode == "after_tag":
            stripped = self._pending.lstrip()
            if not stripped:
                return False
            self._pending, self._mode = (stripped[1:], "array_between") if stripped[0] == "[" else (stripped, "name")
            return True
        if mode == "array_between":
            stripped = self._pending.lstrip().lstrip(",").lstrip()
            self._pending = stripped
            if not stripped:
                return False
            if stripped.startswith("]"):
                self._pending, self._mode = stripped[1:], "text"
            else:
                self._start_call()
                self._mode = "array"
            return True
        if mode == "array":
            outcome = self._read_call(events)
            if outcome != "wait":
                self._mode = "array_between" if outcome == "call" else "text"
            return outcome != "wait"
        if mode == "name":
            at = self._pending.find(ARGS)
            if at < 0:
                return False
            name = self._pending[:at].split(CALL_ID)[0].strip()
            self._pending = self._pending[at + len(ARGS) :]
            self._start_call()
            assert self._call is not None
            self._call.feed(f'{{"name": {json.dumps(name)}, "arguments": ', events)
            self._mode = "args"
            return True
        return self._arguments(events)

    def _arguments(self, events: list[StreamEvent]) -> bool:
        """The v11 arguments value, a character at a time (what follows it is the next tag),
        then the object's close, fed by us."""
        assert self._call is not None
        consumed = 0
        while consumed < len(self._pending) and not self._call.scanner.value_complete:
            consumed += self._call.feed(self._pending[consumed], events)
        self._pending = self._pending[consumed:]
        if not self._call.scanner.value_complete:
            return False
        self._call.feed("}", events)
        self._finish_call(events)
        self._mode = "text"
        return True
