"""How loaded the engine is: sliding-window figures for load shedding and metrics.

The engine thread records events (a request admitted after waiting, a first token, a finish);
the event loop reads a `LoadSnapshot`. A lock guards the windows: both threads touch them, and
the critical sections are a few deque operations.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    num_waiting: int
    num_running: int
    max_num_seqs: int
    queue_time_p90: float  # seconds, over the window; 0 when nothing was admitted
    ttft_p90: float  # seconds from arrival to first token, over the window
    error_rate: float  # errored / finished requests over the window
    kv_usage: float  # running sequences' tokens / (max_num_seqs * max_model_len)
    num_waiting_tokens: int  # prompt tokens of waiting requests


class LoadStats:
    def __init__(self, window_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_seconds = window_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._queue_times: deque[tuple[float, float]] = deque()  # (at, seconds)
        self._ttfts: deque[tuple[float, float]] = deque()
        self._finishes: deque[tuple[float, bool]] = deque()  # (at, is_error)

    def record_queue_time(self, seconds: float) -> None:
        with self._lock:
            self._queue_times.append((self.clock(), seconds))

    def record_ttft(self, seconds: float) -> None:
        with self._lock:
            self._ttfts.append((self.clock(), seconds))

    def record_finish(self, is_error: bool) -> None:
        with self._lock:
            self._finishes.append((self.clock(), is_error))

    def window(self) -> tuple[float, float, float]:
        """(queue time p90, TTFT p90, error rate) over the last window_seconds."""
        horizon = self.clock() - self.window_seconds
        with self._lock:
            for events in (self._queue_times, self._ttfts, self._finishes):
                while events and events[0][0] < horizon:
                    events.popleft()
            queue_times = [s for _, s in self._queue_times]
            ttfts = [s for _, s in self._ttfts]
            num_errors = sum(1 for _, is_error in self._finishes if is_error)
            num_finished = len(self._finishes)
        return _p90(queue_times), _p90(ttfts), (num_errors / num_finished if num_finished else 0.0)


def _p90(values: list[float]) -> float:
    if not values:
        return 0.0
    values.sort()
    return values[min(len(values) - 1, int(0.9 * len(values)))]
