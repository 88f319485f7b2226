"""The machinery every format's stream shares: a call's lifetime as stream events.

`CallBuilder` turns what a `JsonCallScanner` reads into OpenAI's fragments: the first one
(index, id, name) as soon as the name is complete, then the arguments' text as it is written.
Arguments written as a JSON string (some models do) are sent once, decoded, when complete; a
call with none gets "{}". `fold` runs a stream over a whole reply, which is how a reply is parsed
whole: the same code, so the streamed fragments always join to the parsed reply.
"""

from __future__ import annotations

import json
from typing import Protocol

from app.tools.calls import ArgumentsDelta, CallStart, ContentDelta, ParsedReply, StreamEvent, ToolCall, new_call_id
from app.tools.json_call import JsonCallScanner
from app.tools.text import ContentStream, partial_tag_length


class ToolCallStream(Protocol):
    def push(self, text: str) -> list[StreamEvent]:
        """The events a new piece of the reply's text completes."""

    def end(self) -> list[StreamEvent]:
        """The reply is over: what was held back."""


class CallBuilder:
    """One call being read: its scanner, whether its first fragment went out, its index."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.id = new_call_id()
        self.scanner = JsonCallScanner()
        self.started = False
        self._sent_arguments = False
        self._held: list[str] = []  # arguments read before the name

    def feed(self, text: str, events: list[StreamEvent]) -> int:
        """Read `text` into the call; return how many characters were the call's."""
        scanned = self.scanner.feed(text)
        if scanned.name is not None and not self.started:
            self.started = True
            events.append(CallStart(self.index, self.id, scanned.name))
            self._held.append(scanned.arguments)
            self._send("".join(self._held), events)
            self._held = []
        elif self.started:
            self._send(scanned.arguments, events)
        else:
            self._held.append(scanned.arguments)
        return scanned.consumed

    def _send(self, text: str, events: list[StreamEvent]) -> None:
        if text and not self._is_string_arguments:
            events.append(ArgumentsDelta(self.index, text))
            self._sent_arguments = True

    @property
    def _is_string_arguments(self) -> bool:
        return self.scanner.arguments_text.lstrip().startswith('"')

    def finish(self, events: list[StreamEvent]) -> None:
        """The call's object is complete (or the reply ended inside it): its last fragment."""
        if not self.started:
            return
        arguments = self.scanner.arguments_text
        if self._is_string_arguments:
            try:
                decoded = json.loads(arguments)
            except ValueError:
                decoded = None
            events.append(ArgumentsDelta(self.index, decoded if isinstance(decoded, str) else arguments))
        elif not self._sent_arguments:
            events.append(ArgumentsDelta(self.index, "{}"))

    @property
    def raw(self) -> str:
        return "".join(self.scanner.text)


class FormatStream:
    """What every format's stream shares: the undecided text, the content, the call being read.

    A format implements `_step`: advance on `_pending` and say whether to go on (False: wait
    for more text). `_unclaimed` is what is left of an unfinished, unnamed call when the reply
    ends: content, as written."""

    def __init__(self) -> None:
        self._pending = ""  # text not yet decided
        self._content = ContentStream()
        self._call: CallBuilder | None = None  # the call being read
        self._num_calls = 0

    def push(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        self._pending += text
        while self._pending and self._step(events):
            pass
        return events

    def end(self) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if self._call is not None and self._call.started:  # cut short inside a call: what there is of it
            self._finish_call(events)
        else:
            self._pending = self._unclaimed() + self._pending
        self._call = None
        if self._pending:
            self._emit(self._pending, events)
            self._pending = ""
        tail = self._content.end()
        if tail:
            events.append(ContentDelta(tail))
        return events

    def _step(self, events: list[StreamEvent]) -> bool:
        raise NotImplementedError

    def _unclaimed(self) -> str:
        return self._call.raw if self._call is not None else ""

    def _text_until(self, tag: str, events: list[StreamEvent]) -> bool:
        """Send content up to `tag` and consume it (True), or up to what could be its start (False)."""
        at = self._pending.find(tag)
        if at < 0:
            keep = partial_tag_length(self._pending, (tag,))
            self._emit(self._pending[: len(self._pending) - keep], events)
            self._pending = self._pending[len(self._pending) - keep :]
            return False
        self._emit(self._pending[:at], events)
        self._pending = self._pending[at + len(tag) :]
        return True

    def _start_call(self) -> None:
        self._call = CallBuilder(self._num_calls)

    def _feed(self, events: list[StreamEvent]) -> None:
        assert self._call is not None
        consumed = self._call.feed(self._pending, events)
        self._pending = self._pending[consumed:]

    def _read_call(self, events: list[StreamEvent]) -> str:
        """Feed the pending text to the call: "wait" (more to come), "call" (it ended as a call),
        or "text" (it was no call: its text is back in `_pending`, to be sent as content)."""
        assert self._call is not None
        self._feed(events)
        scanner = self._call.scanner
        if not (scanner.failed or scanner.done):
            return "wait"
        if not self._call.started:
            self._pending = self._call.raw + self._pending
            self._call = None
            return "text"
        self._finish_call(events)
        return "call"

    def _finish_call(self, events: list[StreamEvent]) -> None:
        """A real call ends: the whitespace held before it touched it and is not content."""
        assert self._call is not None
        self._call.finish(events)
        self._num_calls += 1
        self._call = None
        self._content.call()

    def _emit(self, text: str, events: list[StreamEvent]) -> None:
        out = self._content.text(text)
        if out:
            events.append(ContentDelta(out))


def fold(stream: ToolCallStream, text: str) -> ParsedReply:
    """A whole reply, parsed by running `stream` over it."""
    events = stream.push(text) + stream.end()
    content: list[str] = []
    calls: list[ToolCall] = []
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, CallStart):
            calls.append(ToolCall(event.name, "", event.id))
        else:
            calls[event.index].arguments += event.text
    text_content = "".join(content)
    return ParsedReply(text_content if text_content or not calls else None, calls)
