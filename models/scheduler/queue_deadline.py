"""The queue deadline: which waiting requests have waited longer than max_queue_seconds.

The scheduler's queue is in priority order; this keeps the same requests in arrival order, so the
oldest are found first. Requests that started running or went away meanwhile are skipped lazily
as they reach the front: no removal from the middle, nothing per step but a look at the front.
Pure: the engine passes the time.
"""

from __future__ import annotations

from collections import deque

from models.scheduler.sequence import Sequence, SequenceStatus


class QueueDeadline:
    def __init__(self, max_queue_seconds: float) -> None:
        """max_queue_seconds: 0 = no deadline."""
        self.max_queue_seconds = max_queue_seconds
        self._arrivals: deque[Sequence] = deque()  # waiting sequences by arrival_time

    def __len__(self) -> int:
        return len(self._arrivals)

    def add(self, seq: Sequence) -> None:
        """A sequence the scheduler now queues (arrivals come in arrival order)."""
        self._arrivals.append(seq)

    def expired(self, now: float) -> list[Sequence]:
        """The waiting sequences that arrived more than max_queue_seconds before `now`, oldest first
        (taken out of the deadline's watch; the caller ends them)."""
        arrivals = self._arrivals
        while arrivals and arrivals[0].status is not SequenceStatus.WAITING:
            arrivals.popleft()
        if not self.max_queue_seconds:
            return []
        cutoff = now - self.max_queue_seconds
        expired = []
        while arrivals and arrivals[0].arrival_time < cutoff:
            seq = arrivals.popleft()
            if seq.status is SequenceStatus.WAITING and not seq.num_preemptions:  # a preempted one has started
                expired.append(seq)
        return expired
