"""The engine's queue in two lanes, light and heavy, so that a surge of long requests does not hold
back short ones (`--heavy-sequence-tokens`; off by default: one lane).

A sequence is heavy when its prompt and its max_tokens reach the bound: what it may hold of the K/V
and of the batch's steps. A request that leaves max_tokens out may run to the end of the context,
and counts so. Each lane keeps (priority, fair tag, arrival) order; the queue takes the better of
the two heads, except that while light sequences wait, heavy ones are admitted only below their
share of the batch (all of it but `light_share`). And where every slot is taken, a waiting light
sequence takes the slot of the latest heavy one past that share, of its own tier or a less
important one (models/scheduler/preemption.py): heavy sequences may fill the batch while no light
one waits (nothing idles), and a light one waits a step, not for a long generation to end.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from models.scheduler.sequence import Sequence

# (priority, fair tag, arrival order, sequence): the order sequences are admitted in.
Entry = tuple[int, int, int, Sequence]


def heavy_share(max_num_seqs: int, light_share: float) -> int:
    """The slots heavy sequences may hold while light ones wait: all but light_share of the batch
    (at least one slot kept for light ones)."""
    return max_num_seqs - max(1, round(light_share * max_num_seqs))


class WaitingLanes:
    def __init__(
        self,
        is_waiting: Callable[[Sequence], bool],
        heavy_tokens: int = 0,
        max_num_seqs: int = 1,
        light_share: float = 0,
    ) -> None:
        """`is_waiting(seq)`: whether an entry is still live (aborted ones are dropped lazily);
        `heavy_tokens`: the bound that makes a sequence heavy (0: one lane)."""
        self._heaps: tuple[list[Entry], list[Entry]] = ([], [])  # light, heavy
        self._is_waiting = is_waiting
        self.heavy_tokens = heavy_tokens
        # The slots heavy sequences may hold while light ones wait; None: lanes off.
        self.heavy_share = heavy_share(max_num_seqs, light_share) if heavy_tokens else None

    def add(self, entry: Entry) -> None:
        """A new waiting sequence: its lane decided, then queued."""
        seq = entry[3]
        seq.heavy = bool(self.heavy_tokens) and seq.num_prompt_tokens + seq.params.max_tokens >= self.heavy_tokens
        self.push(entry)

    def push(self, entry: Entry) -> None:
        heapq.heappush(self._heaps[entry[3].heavy], entry)

    def heavy_allowed(self, running: Iterable[Sequence]) -> bool:
        """Whether a heavy sequence may be admitted now: lanes off, no light one waiting, or the
        heavy ones below their share of the batch."""
        if self.heavy_share is None or self.head(False) is None:
            return True
        return sum(seq.heavy for seq in running) < self.heavy_share

    def head(self, heavy: bool) -> Entry | None:
        """The next entry of a lane, stale ones dropped."""
        heap = self._heaps[heavy]
        while heap and not self._is_waiting(heap[0][3]):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def pop(self, heavy_allowed: bool) -> Entry | None:
        """The next entry to admit: the better of the two heads, the heavy one only if allowed."""
        light = self.head(False)
        heavy = self.head(True) if heavy_allowed else None
        best = min((entry for entry in (light, heavy) if entry is not None), default=None)
        if best is not None:
            heapq.heappop(self._heaps[best[3].heavy])
        return best

    def candidates(self, limit: int) -> list[Entry]:
        """The first `limit` live entries of each lane, in queue order."""
        firsts = [heapq.nsmallest(limit, (e for e in heap if self._is_waiting(e[3]))) for heap in self._heaps]
        return sorted(firsts[0] + firsts[1])
