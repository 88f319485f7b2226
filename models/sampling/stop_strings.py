"""Stop strings found in a growing text in time linear in the text, whatever their length.

Each stop string gets a Knuth-Morris-Pratt automaton whose state is the length of the longest
tail of the text so far that is a prefix of the stop string. Feeding a character costs amortised
O(1) per stop string, so a step's cost follows the characters it adds, not the stop strings'
length: the check it replaces sliced and compared every tail up to the longest stop's length, on
every token, which a long stop string made quadratic (milliseconds per token, for every row).
"""

from __future__ import annotations

from collections.abc import Sequence


def _failure(pattern: str) -> list[int]:
    """failure[i]: the length of the longest proper prefix of pattern[: i + 1] that is also its suffix."""
    failure = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = failure[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        failure[i] = k
    return failure


class StopStrings:
    """One sequence's stop strings (non-empty), fed the text as it grows."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._failures = [_failure(stop) for stop in self._stops]
        self._states = [0] * len(self._stops)
        self.matched: str | None = None  # the stop string that ended the text, once one has

    def feed(self, added: str, offset: int) -> int | None:
        """Feed `added`, which starts at index `offset` of the whole text; the index where the
        earliest stop string completed by it starts, or None."""
        earliest: int | None = None
        for k, stop in enumerate(self._stops):
            failure, state, length = self._failures[k], self._states[k], len(stop)
            for i, char in enumerate(added):
                while state and char != stop[state]:
                    state = failure[state - 1]
                if char == stop[state]:
                    state += 1
                if state == length:
                    start = offset + i - length + 1
                    if earliest is None or start < earliest:
                        earliest, self.matched = start, stop
                    break  # this stop's first occurrence; later ones start later
            self._states[k] = state
        return earliest

    @property
    def held(self) -> int:
        """Characters at the end of the text that could still begin a stop string."""
        return max(self._states, default=0)
