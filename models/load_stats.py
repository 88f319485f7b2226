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
from typing import Any


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    num_waiting: int
    num_running: int
    max_num_seqs: int
    queue_time_p90: float  # seconds, over the window; 0 when nothing was admitted
    ttft_p90: float  # seconds from arrival to first token, over the window
    error_rate: float  # errored / finished requests over the window; 0 below MIN_FINISHES_FOR_ERROR_RATE
    # running sequences' tokens / (max_num_seqs * max_model_len); admitted by tokens: reserved / max_kv_tokens
    kv_usage: float
    num_waiting_tokens: int  # prompt tokens of waiting requests


# Finishes a window needs before its error rate counts. NOTE: without it one failed request on
# a quiet server is an error rate of 1.0, which sends the server to degradation level 3 (canned
# replies, no engine finishes to dilute the rate) for the whole window; circuit breakers have the
# same floor (Hystrix's request volume threshold is 20 per 10 s).
MIN_FINISHES_FOR_ERROR_RATE = 20


# How old a `window()` result may be. NOTE: it sorts every sample of the window (thousands under
# load) and every request's admission asks for it, as does every 503 (its Retry-After): computed
# afresh each time it was a good share of the HTTP process's CPU per request. Load shedding reacts
# over seconds; 100 ms of staleness changes nothing.
WINDOW_MAX_AGE_SECONDS = 0.1

# The most events each window keeps: the newest ones, when more than this arrive within
# window_seconds. Without it a window grows with the request rate, and every recomputation sorts
# it (a flood of short requests paid for that in the HTTP process's CPU). A p90 or an error rate
# over the last 4,096 events is as good a load signal as over all of them.
MAX_WINDOW_EVENTS = 4096


class LoadStats:
    def __init__(
        self,
        window_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        min_finishes: int = MIN_FINISHES_FOR_ERROR_RATE,
        max_age_seconds: float = WINDOW_MAX_AGE_SECONDS,
        max_events: int = MAX_WINDOW_EVENTS,
    ) -> None:
        self.window_seconds = window_seconds
        self.clock = clock
        self.min_finishes = min_finishes
        self.max_age_seconds = max_age_seconds
        self._cached: tuple[float, tuple[float, float, float]] | None = None  # (computed at, result)
        self._lock = threading.Lock()
        self._queue_times: deque[tuple[float, float]] = deque(maxlen=max_events)  # (at, seconds)
        self._ttfts: deque[tuple[float, float]] = deque(maxlen=max_events)
        self._finishes: deque[tuple[float, bool]] = deque(maxlen=max_events)  # (at, is_error)

    # NOTE: each record drops what has left the window, not only `window()`: a LoadStats nobody
    # reads (the engine process's own, while the server keeps the one it reads) grew without
    # bound, three entries per request (found by the soak's tracemalloc dumps).
    def record_queue_time(self, seconds: float) -> None:
        now = self.clock()
        with self._lock:
            self._queue_times.append((now, seconds))
            _drop_before(self._queue_times, now - self.window_seconds)

    def record_ttft(self, seconds: float) -> None:
        now = self.clock()
        with self._lock:
            self._ttfts.append((now, seconds))
            _drop_before(self._ttfts, now - self.window_seconds)

    def record_finish(self, is_error: bool) -> None:
        now = self.clock()
        with self._lock:
            self._finishes.append((now, is_error))
            _drop_before(self._finishes, now - self.window_seconds)

    def window(self) -> tuple[float, float, float]:
        """(queue time p90, TTFT p90, error rate) over the last window_seconds (at most the
        newest `max_events` of each), as of at most `max_age_seconds` ago."""
        now = self.clock()
        cached = self._cached
        if cached is not None and 0.0 <= now - cached[0] < self.max_age_seconds:
            return cached[1]
        horizon = now - self.window_seconds
        with self._lock:
            for events in (self._queue_times, self._ttfts, self._finishes):
                _drop_before(events, horizon)
            queue_times = [s for _, s in self._queue_times]
            ttfts = [s for _, s in self._ttfts]
            num_errors = sum(1 for _, is_error in self._finishes if is_error)
            num_finished = len(self._finishes)
        error_rate = num_errors / num_finished if num_finished >= max(1, self.min_finishes) else 0.0
        result = (_p90(queue_times), _p90(ttfts), error_rate)
        self._cached = (now, result)
        return result


def _drop_before(events: deque[tuple[float, Any]], horizon: float) -> None:
    while events and events[0][0] < horizon:
        events.popleft()


def _p90(values: list[float]) -> float:
    if not values:
        return 0.0
    values.sort()
    return values[min(len(values) - 1, int(0.9 * len(values)))]
