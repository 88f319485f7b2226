"""How loaded the server is: sliding-window figures by tier, for load shedding and metrics.

One sample per API request, never per sequence (a request of 16 prompts x n 16 is 256 sequences
and one sample): the server's side of the engine records them (models/load/requests.py). Samples
keep the tier that produced them, and a tier's figures pool the samples of that tier and of the
tiers above it (more important: lower numbers), never of the tiers below, so a low tier's surge
shows in its own figures and not in a higher tier's.

Waits fade: a queue time or a time to first token that ended `age` seconds ago counts as its value
x 2^(-age / half_life). NOTE: without it one slow request held the p90 (and so its degradation
level) for the whole 30 s window and the cooldown after it, long after the load had gone.

Pure logic on an injected clock. A lock guards the windows: the event loop records and reads them,
and metrics may read them from elsewhere; the critical sections are a few deque operations.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """The engine's load as one tier sees it (or the whole server's, for no tier in particular)."""

    num_waiting: int  # sequences waiting: of the tier and the tiers above it
    num_running: int
    max_num_seqs: int
    queue_time_p90: float  # seconds, requests of the window and those still waiting; 0 without any
    ttft_p90: float  # seconds from arrival to a request's first token, over the window
    error_rate: float  # requests that failed / requests that ended; 0 below MIN_FINISHES_FOR_ERROR_RATE
    # running sequences' tokens / (max_num_seqs * max_model_len); admitted by tokens: reserved / max_kv_tokens
    kv_usage: float
    num_waiting_tokens: int  # prompt tokens of waiting requests (every tier)
    step_time_p90: float = 0.0  # seconds of the engine's steps over the window (MIN_STEPS of them at least)
    full_step_seconds: float = 0.0  # the engine's decode step of every slot, timed at warmup (0: unknown)
    memory_usage: float = 0.0  # 0..1: the container's (or machine's) memory, or the fullest GPU's
    compute_usage: float = 0.0  # 0..1: the container's (or machine's) CPU, smoothed, or the busiest GPU
    # Whether the shared figures (KV use, steps, memory, CPU) count for this tier: they are charged to
    # the least important tier with requests in flight and the tiers below it (models/load/requests.py).
    bears_shared_load: bool = True


# Requests a window needs to have ended before its error rate counts. NOTE: without it one failed
# request on a quiet server is an error rate of 1.0, which sends the server to degradation level 3
# (canned replies, no engine finishes to dilute the rate) for the whole window; circuit breakers
# have the same floor (Hystrix's request volume threshold is 20 per 10 s).
MIN_FINISHES_FOR_ERROR_RATE = 20

# Steps a window needs before its step time counts: a lone slow step (the first of a new shape, a
# garbage collection) is not a slow engine.
MIN_STEPS = 16

# How old a `window()` result may be. NOTE: it sorts every sample of the window (thousands under
# load) and every request's admission asks for it, as does every 503 (its Retry-After): computed
# afresh each time it was a good share of the HTTP process's CPU per request. Load shedding reacts
# over seconds; 100 ms of staleness changes nothing.
WINDOW_MAX_AGE_SECONDS = 0.1

# The most events each tier's window keeps: the newest ones, when more than this arrive within
# window_seconds. Without it a window grows with the request rate, and every recomputation sorts
# it (a flood of short requests paid for that in the HTTP process's CPU). A p90 or an error rate
# over the last 4,096 events is as good a load signal as over all of them.
MAX_WINDOW_EVENTS = 4096

# Seconds for a past wait to count half as much: a 20 s wait is a 2.5 s one 15 s later.
WAIT_HALF_LIFE_SECONDS = 5.0

ALL_TIERS: int | None = None  # `window(ALL_TIERS)`: the whole server


class LoadStats:
    def __init__(
        self,
        window_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        min_finishes: int = MIN_FINISHES_FOR_ERROR_RATE,
        max_age_seconds: float = WINDOW_MAX_AGE_SECONDS,
        max_events: int = MAX_WINDOW_EVENTS,
        half_life_seconds: float | None = WAIT_HALF_LIFE_SECONDS,  # None: waits never fade
    ) -> None:
        self.window_seconds = window_seconds
        self.clock = clock
        self.min_finishes = min_finishes
        self.max_age_seconds = max_age_seconds
        self.max_events = max_events
        self.half_life_seconds = half_life_seconds
        self._cached: dict[int | None, tuple[float, tuple[float, float, float]]] = {}  # tier: (computed at, result)
        self._lock = threading.Lock()
        self._queue_times: dict[int, deque[tuple[float, float]]] = {}  # tier: (at, seconds)
        self._ttfts: dict[int, deque[tuple[float, float]]] = {}
        self._finishes: dict[int, deque[tuple[float, bool]]] = {}  # tier: (at, is_error)
        self._steps: deque[tuple[float, float]] = deque(maxlen=max_events)  # (at, seconds), every tier's
        self._step_p90: tuple[float, float] = (float("-inf"), 0.0)  # (computed at, p90)

    # NOTE: each record drops what has left the window, not only `window()`: a LoadStats nobody
    # reads grew without bound, three entries per request (found by the soak's tracemalloc dumps).
    def record_queue_time(self, seconds: float, tier: int = 0) -> None:
        self._record(self._queue_times, tier, seconds)

    def record_ttft(self, seconds: float, tier: int = 0) -> None:
        self._record(self._ttfts, tier, seconds)

    def record_finish(self, is_error: bool, tier: int = 0) -> None:
        """A request ended; `is_error`: the server failed it (never the client's own mistake)."""
        self._record(self._finishes, tier, is_error)

    def record_step(self, seconds: float) -> None:
        """An engine step's forward pass and sampling took `seconds` (any thread)."""
        now = self.clock()
        with self._lock:
            self._steps.append((now, seconds))
            _drop_before(self._steps, now - self.window_seconds)

    def step_time_p90(self) -> float:
        """The p90 of the window's step times; 0 with fewer than MIN_STEPS steps in it (idle)."""
        now = self.clock()
        computed_at, p90 = self._step_p90
        if 0.0 <= now - computed_at < self.max_age_seconds:
            return p90
        with self._lock:
            _drop_before(self._steps, now - self.window_seconds)
            times = [seconds for _, seconds in self._steps]
        p90 = _p90(times) if len(times) >= MIN_STEPS else 0.0
        self._step_p90 = (now, p90)
        return p90

    def _record(self, windows: dict[int, deque[tuple[float, Any]]], tier: int, value: object) -> None:
        now = self.clock()
        with self._lock:
            events = windows.get(tier)
            if events is None:
                events = windows[tier] = deque(maxlen=self.max_events)
            events.append((now, value))
            _drop_before(events, now - self.window_seconds)

    def window(
        self, tier: int | None = ALL_TIERS, waiting_since: Callable[[], Iterable[float]] = tuple
    ) -> tuple[float, float, float]:
        """(queue time p90, TTFT p90, error rate) of `tier` and the tiers above it (every tier for
        ALL_TIERS) over the last window_seconds, as of at most `max_age_seconds` ago.
        `waiting_since()`: when the requests of those tiers still waiting arrived; their waits so
        far count among the queue times."""
        now = self.clock()
        cached = self._cached.get(tier)
        if cached is not None and 0.0 <= now - cached[0] < self.max_age_seconds:
            return cached[1]
        horizon = now - self.window_seconds
        with self._lock:
            queue_times = self._faded(self._queue_times, tier, horizon, now)
            ttfts = self._faded(self._ttfts, tier, horizon, now)
            num_errors = num_finished = 0
            for events in _of_tier(self._finishes, tier):
                _drop_before(events, horizon)
                num_finished += len(events)
                num_errors += sum(1 for _, is_error in events if is_error)
        queue_times += [now - arrived for arrived in waiting_since()]
        error_rate = num_errors / num_finished if num_finished >= max(1, self.min_finishes) else 0.0
        result = (_p90(queue_times), _p90(ttfts), error_rate)
        self._cached[tier] = (now, result)
        return result

    def _faded(
        self, windows: dict[int, deque[tuple[float, float]]], tier: int | None, horizon: float, now: float
    ) -> list[float]:
        half_life = self.half_life_seconds
        values = []
        for events in _of_tier(windows, tier):
            _drop_before(events, horizon)
            if half_life is None:
                values += [seconds for _, seconds in events]
            else:
                values += [seconds * 0.5 ** ((now - at) / half_life) for at, seconds in events]
        return values


def _of_tier(windows: dict[int, deque[tuple[float, Any]]], tier: int | None) -> list[deque[tuple[float, Any]]]:
    return [events for t, events in windows.items() if tier is None or t <= tier]


def _drop_before(events: deque[tuple[float, Any]], horizon: float) -> None:
    while events and events[0][0] < horizon:
        events.popleft()


def _p90(values: list[float]) -> float:
    if not values:
        return 0.0
    values.sort()
    return values[min(len(values) - 1, int(0.9 * len(values)))]
