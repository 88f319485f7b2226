"""models/process/child.py: the queue figures it reports are never fewer than are waiting, as the server reads them."""

from __future__ import annotations

from typing import Any

from models.kv.prefix_cache import PrefixCacheStats
from models.process.child import RecordingObserver, _Outbox
from models.process.messages import StepReport


class _Conn:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, message: Any) -> None:
        self.sent.append(message)


class _CoreWithArrivingRequest:
    """A core whose queue is read while the receiver thread takes one more request off the pipe:
    it lands in the inbox, then the outbox counts it as received (the receiver's order)."""

    is_warm = True
    num_waiting_tokens = num_running = num_aborted = num_preempted = num_steps = 0
    kv_usage = full_step_seconds = 0.0
    prefix_cache_stats = PrefixCacheStats()

    def __init__(self, outbox_ref: list[_Outbox], num_waiting: int) -> None:
        self._outbox_ref = outbox_ref
        self._num_waiting = num_waiting

    @property
    def num_waiting(self) -> int:
        waiting = self._num_waiting  # read first...
        self._num_waiting += 1  # ...then the receiver thread adds a request to the inbox
        self._outbox_ref[0].num_received += 1  # and counts it
        return waiting


def test_stats_never_miss_a_request_received_while_they_are_read() -> None:
    """Regression (overload run, surge_requests_waiting 33 with --max-queued-requests 32): the
    count of received requests was read after the queue, so a request that arrived in between
    was in neither figure, and the server's "queue + sent since the report" missed it."""
    outbox_ref: list[_Outbox] = []
    core = _CoreWithArrivingRequest(outbox_ref, num_waiting=3)
    conn = _Conn()
    outbox = _Outbox(conn, [core], RecordingObserver())  # type: ignore[arg-type, list-item]
    outbox_ref.append(outbox)
    outbox.num_received = 3  # the server sent 3 requests, all in the queue
    num_sent = 4  # and a fourth, which arrives while the figures are read

    outbox.flush()
    report = conn.sent[-1]
    assert isinstance(report, StepReport)
    stats = report.stats
    waiting_by_server = stats.num_waiting + max(0, num_sent - stats.num_received)  # as EngineProcess.num_waiting
    assert waiting_by_server >= 4
