"""Reasoning text (`<think>...</think>`, Qwen3 and DeepSeek-R1 style) apart from the content.

A reply reasons when its very first characters are `<think>` (Qwen3 writes the tag itself), or
when the prompt already opened the block (templates that end the generation prompt with
`<think>\\n`, as DeepSeek-R1's do): then the text up to `</think>` is `reasoning_content` and the
rest is content, its leading whitespace dropped. A reply cut short before `</think>` is all
reasoning. Anything else is content, unchanged; a `</think>` that closes nothing is just text.

It runs before the tool-call parser, which only ever sees the content. Whole replies are the
stream run over them, so the two always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.tools.calls import ContentDelta
from app.tools.text import partial_tag_length

OPEN = "<think>"
CLOSE = "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


ReasoningEvent = ReasoningDelta | ContentDelta


def template_reasons(chat_template: str | None) -> bool:
    """Whether a chat template is a reasoning model's: it writes (or strips) a reasoning tag."""
    template = chat_template or ""
    return OPEN in template or CLOSE in template


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """The generation prompt ends inside a reasoning block (its last tag is an opening one)."""
    tail = prompt_text.rstrip()
    return tail.endswith(OPEN)


class ReasoningStream:
    def __init__(self, *, in_reasoning: bool) -> None:
        self._mode = "reasoning" if in_reasoning else "start"  # start | reasoning | after | content
        self._pending = ""

    def push(self, text: str) -> list[ReasoningEvent]:
        events: list[ReasoningEvent] = []
        self._pending += text
        while self._pending and self._step(events):
            pass
        return events

    def end(self) -> list[ReasoningEvent]:
        pending, self._pending = self._pending, ""
        if not pending:
            return []
        if self._mode == "reasoning":
            return [ReasoningDelta(pending)]
        return [ContentDelta(pending)]

    def _step(self, events: list[ReasoningEvent]) -> bool:
        if self._mode == "start":
            # NOTE: only a reply that starts with the tag itself reasons (as Qwen3 and R1 write
            # it), so a plain reply is held back at most while it could still be the tag: its
            # first deltas go out as they come.
            if OPEN.startswith(self._pending) and self._pending != OPEN:
                return False  # it may still open
            if self._pending.startswith(OPEN):
                self._pending = self._pending[len(OPEN) :]
                self._mode = "reasoning"
            else:
                self._mode = "content"
            return True
        if self._mode == "reasoning":
            at = self._pending.find(CLOSE)
            if at < 0:
                keep = partial_tag_length(self._pending, (CLOSE,))
                sent = self._pending[: len(self._pending) - keep]
                if sent:
                    events.append(ReasoningDelta(sent))
                self._pending = self._pending[len(sent) :]
                return False
            if at:
                events.append(ReasoningDelta(self._pending[:at]))
            self._pending = self._pending[at + len(CLOSE) :]
            self._mode = "after"
            return True
        if self._mode == "after":
            stripped = self._pending.lstrip()
            if not stripped:
                self._pending = ""
                return False
            self._pending = stripped
            self._mode = "content"
            return True
        events.append(ContentDelta(self._pending))
        self._pending = ""
        return False


def split_reasoning(text: str, *, in_reasoning: bool) -> tuple[str | None, str]:
    """A whole reply as (reasoning_content or None, content)."""
    stream = ReasoningStream(in_reasoning=in_reasoning)
    events = stream.push(text) + stream.end()
    reasoning = "".join(event.text for event in events if isinstance(event, ReasoningDelta))
    content = "".join(event.text for event in events if isinstance(event, ContentDelta))
    return reasoning or None, content
