"""models/scheduler/queue_deadline.py: the waiting requests past max_queue_seconds, oldest first, with made-up times."""

from __future__ import annotations

from models.sampling.params import SamplingParams
from models.scheduler.queue_deadline import QueueDeadline
from models.scheduler.sequence import Sequence, SequenceStatus


def seq(name: str, arrival_time: float) -> Sequence:
    return Sequence(name, [1, 2], SamplingParams(max_tokens=4), arrival_time=arrival_time)


def test_only_the_requests_still_waiting_past_the_deadline_expire() -> None:
    deadline = QueueDeadline(max_queue_seconds=10.0)
    old, running, recent = seq("old", 0.0), seq("running", 1.0), seq("recent", 5.0)
    for s in (old, running, recent):
        deadline.add(s)
    running.status = SequenceStatus.RUNNING
    assert deadline.expired(now=9.0) == []
    assert deadline.expired(now=12.0) == [old]  # `running` left the queue; `recent` has time
    assert deadline.expired(now=16.0) == [recent]
    assert len(deadline) == 0


def test_no_deadline_expires_nothing_and_keeps_only_what_waits() -> None:
    deadline = QueueDeadline(max_queue_seconds=0.0)
    gone, waiting = seq("gone", 0.0), seq("waiting", 1.0)
    deadline.add(gone)
    deadline.add(waiting)
    gone.status = SequenceStatus.FINISHED
    assert deadline.expired(now=1e9) == []
    assert len(deadline) == 1  # the finished one was dropped from the front
