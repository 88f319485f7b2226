"""Fair places in the engine's queue: the sequences of one share (an API key) interleave with
other shares' within a priority level, instead of all waiting behind one share's burst.

Start-time fair queuing with a unit cost per sequence: a sequence of share s is tagged
max(V, s's last tag) + 1, where V is the tag of the sequence the scheduler took last, and the
queue takes the lowest tag first within a priority level (arrival order breaks ties). A burst of
k sequences takes tags V+1 .. V+k; a share arriving behind it is tagged V'+1, ahead of the
burst's rest: one key's 200 queued requests delay another key's request by a place or so, not
by 200. With a single share, tags follow arrival order: the queue is FIFO, as before.

Bounded: a share is forgotten as soon as none of its sequences wait (its next one starts at V).
"""

from __future__ import annotations


class FairShares:
    def __init__(self) -> None:
        self._last_tag: dict[str, int] = {}
        self._num_waiting: dict[str, int] = {}
        self._virtual = 0  # the tag of the sequence taken last

    def __len__(self) -> int:
        """Shares with a sequence waiting."""
        return len(self._num_waiting)

    def tag(self, share: str) -> int:
        """A new waiting sequence of `share`: its place within its priority level."""
        tag = max(self._virtual, self._last_tag.get(share, 0)) + 1
        self._last_tag[share] = tag
        self._num_waiting[share] = self._num_waiting.get(share, 0) + 1
        return tag

    def took(self, share: str, tag: int) -> None:
        """The scheduler took a waiting sequence of `share` tagged `tag`."""
        self._virtual = max(self._virtual, tag)
        self.left(share)

    def left(self, share: str) -> None:
        """A waiting sequence of `share` left the queue (taken, aborted or expired)."""
        remaining = self._num_waiting[share] - 1
        if remaining:
            self._num_waiting[share] = remaining
        else:
            del self._num_waiting[share]
            del self._last_tag[share]
