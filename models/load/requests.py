"""Request-level load on the server's side of the engine: one sample per API request, by tier.

The engine knows sequences; the server knows requests (a `RequestGroup` is one request's
sequences). So the load figures are recorded here, from the outputs the server hands to a
request's group, the same way whether the engine runs on a thread or in its own process:
- a request's queue time: its first sequence's (the engine measures it, and sends it with that
  sequence's first output), or its wait until its first output if it ended unrun;
- its time to first token: until the first token of any of its sequences;
- its end: a failure if any of its sequences ended with `FinishReason.ERROR` (the server failed
  it; what the request's own input caused is not a server error), else a success. A request the
  client left before it ended, with no failure, is not counted.
Beside the samples, what is in flight now: sequences that have produced nothing yet (waiting, by
tier and by share of the queue) and requests not yet ended (by tier).

NOTE: shared figures (KV-cache use) cannot be told apart by tier, so they count for the least
important tier with a request in flight, and the tiers below it: degrading that tier is what
frees the cache soonest, and a more important tier is never degraded by a lower one's use.

Runs on the event loop only; pure logic on an injected clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from models.engine.outputs import RequestOutput
from models.load.stats import ALL_TIERS, LoadStats
from models.scheduler.sequence import FinishReason

K = TypeVar("K")


class RequestLoad:
    def __init__(self, stats: LoadStats | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.stats = stats if stats is not None else LoadStats(clock=clock)
        self._num_waiting_by_tier: dict[int, int] = {}  # sequences that produced nothing yet
        self._num_waiting_by_share: dict[str, int] = {}
        self._num_in_flight_by_tier: dict[int, int] = {}  # requests not yet ended
        self._waiting_since: dict[int, dict[RequestTrack, float]] = {}  # requests with no output yet: arrival

    def start(self, num_sequences: int, tier: int = 0, share: str = "") -> RequestTrack:
        """A request of `num_sequences` sequences submitted now; feed its outputs to the track."""
        track = RequestTrack(self, num_sequences, tier, share, self.clock())
        _add(self._num_waiting_by_tier, tier, num_sequences)
        _add(self._num_waiting_by_share, share, num_sequences)
        _add(self._num_in_flight_by_tier, tier, 1)
        self._waiting_since.setdefault(tier, {})[track] = track.arrived
        return track

    def num_waiting(self, tier: int | None = ALL_TIERS) -> int:
        """Sequences of `tier` and the tiers above it (every tier for ALL_TIERS) with no output yet."""
        return sum(n for t, n in self._num_waiting_by_tier.items() if tier is None or t <= tier)

    def num_waiting_of(self, share: str) -> int:
        """Sequences of one share of the queue (an API key) with no output yet."""
        return self._num_waiting_by_share.get(share, 0)

    def lowest_tier_in_flight(self) -> int | None:
        """The least important tier with a request in flight (the highest number), None if idle."""
        return max(self._num_in_flight_by_tier, default=None)

    def bears_shared_load(self, tier: int) -> bool:
        lowest = self.lowest_tier_in_flight()
        return lowest is None or tier >= lowest

    def window(self, tier: int | None = ALL_TIERS) -> tuple[float, float, float]:
        """(queue time p90, TTFT p90, error rate) of `tier` and the tiers above it; requests still
        waiting count with their wait so far."""

        def waiting_since() -> list[float]:
            return [
                arrived
                for t, requests in self._waiting_since.items()
                if tier is None or t <= tier
                for arrived in requests.values()
            ]

        return self.stats.window(tier, waiting_since)


class RequestTrack:
    """One request's sequences, as the load figures see them: fed every output, ended once."""

    def __init__(self, load: RequestLoad, num_sequences: int, tier: int, share: str, arrived: float) -> None:
        self._load = load
        self.num_sequences = num_sequences
        self.tier = tier
        self.share = share
        self.arrived = arrived
        self._started: set[str] = set()  # sequences that produced an output
        self._num_finished = 0
        self._has_token = False
        self._has_failed = False
        self.is_ended = False

    def output(self, output: RequestOutput) -> None:
        if self.is_ended:
            return
        load, tier = self._load, self.tier
        # Per token of every stream: the common case (a later token) reads no clock and takes no lock.
        if output.request_id not in self._started:
            self._started.add(output.request_id)
            _add(load._num_waiting_by_tier, tier, -1)
            _add(load._num_waiting_by_share, self.share, -1)
            if len(self._started) == 1:  # the request's first output: one queue-time sample
                self._stop_waiting()
                wait = output.queue_time if output.queue_time is not None else load.clock() - self.arrived
                load.stats.record_queue_time(wait, tier)
        if output.token_ids and not self._has_token:
            self._has_token = True
            load.stats.record_ttft(load.clock() - self.arrived, tier)
        if output.finished:
            self._num_finished += 1
            self._has_failed |= output.finish_reason is FinishReason.ERROR
            if self._num_finished >= self.num_sequences:
                load.stats.record_finish(self._has_failed, tier)
                self._end()

    def end(self) -> None:
        """The request is over before all its sequences ended (its client left, or it failed and its
        route stopped reading): one failure if a sequence had failed, else no sample."""
        if self.is_ended:
            return
        if self._has_failed:
            self._load.stats.record_finish(True, self.tier)
        self._end()

    def _end(self) -> None:
        self.is_ended = True
        load = self._load
        num_unstarted = self.num_sequences - len(self._started)
        _add(load._num_waiting_by_tier, self.tier, -num_unstarted)
        _add(load._num_waiting_by_share, self.share, -num_unstarted)
        _add(load._num_in_flight_by_tier, self.tier, -1)
        self._stop_waiting()

    def _stop_waiting(self) -> None:
        waiting = self._load._waiting_since.get(self.tier)
        if waiting is not None:
            waiting.pop(self, None)
            if not waiting:
                del self._load._waiting_since[self.tier]


def _add(counts: dict[K, int], key: K, delta: int) -> None:
    """Add `delta` to `counts[key]`, forgetting keys that reach 0 (shares come and go)."""
    value = counts.get(key, 0) + delta
    if value:
        counts[key] = value
    else:
        counts.pop(key, None)
