"""Reply text around tool calls, streamed so that it joins to exactly what a whole parse gives.

The rule both share: text outside calls is content, except the whitespace that touches a call
(the newlines a format puts between text and tags), which is dropped; a reply with no call is
its text unchanged. A stream therefore holds back trailing whitespace (a call may follow), and
any tail that could be the start of an opening tag, until the next text decides.
"""

from __future__ import annotations

from collections.abc import Sequence


def partial_tag_length(text: str, tags: Sequence[str]) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    longest = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:size]):
                longest = size
                break
    return longest


class ContentStream:
    """Text of a streamed reply outside calls: what may be sent now, what waits."""

    def __init__(self) -> None:
        self._held = ""  # trailing whitespace, sent if text (not a call) follows
        self._after_call = False  # the last thing was a call: leading whitespace is dropped

    def text(self, text: str) -> str:
        """Text outside a call (with no partial tag at its end); what to send now."""
        if self._after_call:
            text = text.lstrip()
            if not text:
                return ""
            self._after_call = False
        stripped = text.rstrip()
        if not stripped:
            self._held += text
            return ""
        out = self._held + stripped
        self._held = text[len(stripped) :]
        return out

    def call(self) -> None:
        """A call starts here: held whitespace touches it and is dropped."""
        self._held = ""
        self._after_call = True

    def end(self) -> str:
        """The reply ended; trailing whitespace that touches no call is content."""
        held, self._held = self._held, ""
        return "" if self._after_call else held
