"""Fair places in the engine's queue: the sequences of one share (an API key) interleave with
other shares' within a priority level, instead of all waiting behind one share's burst; and within
a share, its users' (the request's `user`) interleave the same way.

Start-time fair queuing: a sequence of share s and user u is tagged max(V, (s, u)'s last tag) +
c, where V is the tag of the sequence the scheduler took last and c the number of s's users with
sequences waiting, and the queue takes the lowest tag first within a priority level (arrival
order breaks ties). With one user per share, c is 1: a burst of k sequences takes tags V+1 ..
V+k; a share arriving behind it is tagged V'+1, ahead of the burst's rest: one key's 200 queued
requests delay another key's request by a place or so, not by 200. With u users waiting, each
advances by u a sequence, so the share as a whole still advances by about one: a key's users
split its place among them (one user's burst does not hold its key's other users behind it), and
a key that names many users gets no more of the queue than a key with one. With a single share
and user, tags follow arrival order: the queue is FIFO, as before.

Bounded: a user is forgotten as soon as none of its sequences wait, a share with its last user.
"""

from __future__ import annotations


class FairShares:
    def __init__(self) -> None:
        self._last_tag: dict[tuple[str, str], int] = {}
        self._num_waiting: dict[tuple[str, str], int] = {}
        self._users: dict[str, int] = {}  # share: its users with sequences waiting
        self._virtual = 0  # the tag of the sequence taken last

    def __len__(self) -> int:
        """Shares with a sequence waiting."""
        return len(self._users)

    def tag(self, share: str, user: str = "") -> int:
        """A new waiting sequence of `share` (and `user`): its place within its priority level."""
        key = (share, user)
        if key not in self._num_waiting:
            self._users[share] = self._users.get(share, 0) + 1
        tag = max(self._virtual, self._last_tag.get(key, 0)) + self._users[share]
        self._last_tag[key] = tag
        self._num_waiting[key] = self._num_waiting.get(key, 0) + 1
        return tag

    def took(self, share: str, tag: int, user: str = "") -> None:
        """The scheduler took a waiting sequence of `share` (and `user`) tagged `tag`."""
        self._virtual = max(self._virtual, tag)
        self.left(share, user)

    def left(self, share: str, user: str = "") -> None:
        """A waiting sequence of `share` (and `user`) left the queue (taken, aborted or expired)."""
        key = (share, user)
        remaining = self._num_waiting[key] - 1
        if remaining:
            self._num_waiting[key] = remaining
            return
        del self._num_waiting[key]
        del self._last_tag[key]
        users = self._users[share] - 1
        if users:
            self._users[share] = users
        else:
            del self._users[share]
