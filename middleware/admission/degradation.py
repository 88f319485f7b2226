"""Tiered degradation: a load score per tier from the engine, mapped to a level with hysteresis.

    0 normal
    1 logprobs are not computed
    2 max_tokens clamped, long prompts rejected
    3 replies from the dedup cache when possible, else a canned reply
    4 shed: 503 with Retry-After, lowest priority first

The load score is the worst of several signals, each a ratio that is 1.0 at its configured bound:
from the requests, waiting sequences / queue depth, queue-time p90 / queue seconds, TTFT p90 /
TTFT seconds, error rate / error rate; from the engine itself, its step time p90 / step seconds
(each decoding sequence waits one step per token), KV-pool use / its bound, and memory use and
CPU (or GPU) busy share / theirs (models/load/host.py). A bound of 0 turns its signal off.

The step-time bound is the larger of `step_seconds` and `full_step_factor` x the step of every
slot decoding that the engine timed at warmup. NOTE: a fixed bound alone read a big model on a
small CPU as overloaded at its normal pace: a full 32-row step of a 1.5B model in float32 on 2
cores takes ~0.8 s, 4x the 0.2 s default, which is level 3 (canned replies) for a server doing
nothing but its ordinary work. Relative to its own full-load step, the signal says what it is
for: steps slower than this engine's normal (long contexts, a noisy neighbour, swapping).

Each tier's level is a circuit breaker with hysteresis: level k opens when the score reaches the
k-th threshold (at once: load rises fast), and closes one level at a time only after the score has
stayed below `1 - hysteresis` of the current level's threshold for a whole cooldown window (load
falls noisily, and a score hovering at a threshold must not flap the level).

Every tier has its own level (`TierLevels`): its score is the worst of its own load and of the
tiers above it (more important: lower numbers), never of the tiers below. So a low tier's surge
degrades that tier, up to canned replies and shedding (which only ever apply to tiers at or past
--shed-priority), and a more important tier is never degraded more than a less important one.
Pure logic: the signal and the clock are injected.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from models import LoadSnapshot

MAX_LEVEL = 4


@dataclass(frozen=True, slots=True)
class DegradationConfig:
    # Load scores that enter levels 1..4; empty turns degradation off.
    thresholds: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    queue_depth: int = 64  # waiting requests that count as load 1.0
    queue_seconds: float = 2.0  # queue-time p90 that counts as load 1.0
    ttft_seconds: float = 5.0  # time-to-first-token p90 that counts as load 1.0
    error_rate: float = 0.2  # error rate that counts as load 1.0
    # The engine's own signals (0 turns one off). A step of 200 ms is 5 tokens/s per stream.
    step_seconds: float = 0.2  # step-time p90 that counts as load 1.0 (at least; see full_step_factor)
    # ... or this many times the engine's warmup step of every slot decoding, where that is larger.
    full_step_factor: float = 2.0
    kv_usage: float = 0.9  # share of the KV pool held by running sequences that counts as 1.0
    memory_usage: float = 0.9  # share of the memory limit (or GPU memory) in use that counts as 1.0
    # Off by default: a CPU engine uses every core it is given whenever it is busy, so a busy share
    # says "working", not "overloaded"; turn it on where the machine is shared (0.9, say).
    compute_usage: float = 0.0  # CPU (or GPU) busy share that counts as 1.0
    cooldown_seconds: float = 10.0  # calm needed before stepping down one level
    hysteresis: float = 0.2  # a level closes only below (1 - this) x its threshold
    # How often the score is recomputed at most; requests in between reuse it.
    refresh_seconds: float = 0.05

    def __post_init__(self) -> None:
        if len(self.thresholds) not in (0, MAX_LEVEL):
            raise ValueError(f"degradation needs {MAX_LEVEL} thresholds (or none to turn it off)")
        if any(b <= a for a, b in zip(self.thresholds, self.thresholds[1:], strict=False)):
            raise ValueError("degradation thresholds must increase")
        if min(self.queue_depth, self.queue_seconds, self.ttft_seconds, self.error_rate) <= 0:
            raise ValueError("degradation reference points must be positive")
        if min(self.step_seconds, self.full_step_factor, self.kv_usage, self.memory_usage, self.compute_usage) < 0:
            raise ValueError("the engine's degradation bounds must be positive (or 0: off)")
        if not 0 <= self.hysteresis < 1:
            raise ValueError("degradation hysteresis must be in [0, 1)")

    @property
    def enabled(self) -> bool:
        return bool(self.thresholds)


def load_signals(snapshot: LoadSnapshot, config: DegradationConfig) -> dict[str, float]:
    """Each signal's ratio to its bound (1.0: at it). The engine's figures count only for the tier
    that bears the shared load (models/load/requests.py)."""
    signals = {
        "queue_depth": snapshot.num_waiting / config.queue_depth,
        "queue_time": snapshot.queue_time_p90 / config.queue_seconds,
        "ttft": snapshot.ttft_p90 / config.ttft_seconds,
        "error_rate": snapshot.error_rate / config.error_rate,
    }
    shared = snapshot.bears_shared_load
    step_bound = max(config.step_seconds, config.full_step_factor * snapshot.full_step_seconds)
    for name, value, bound in (
        ("step_time", snapshot.step_time_p90, step_bound if config.step_seconds > 0 else 0.0),
        ("kv_usage", snapshot.kv_usage, config.kv_usage),
        ("memory", snapshot.memory_usage, config.memory_usage),
        ("compute", snapshot.compute_usage, config.compute_usage),
    ):
        signals[name] = value / bound if shared and bound > 0 else 0.0
    return signals


def load_score(snapshot: LoadSnapshot, config: DegradationConfig) -> float:
    return max(load_signals(snapshot, config).values())


class Degrader:
    def __init__(
        self,
        config: DegradationConfig,
        signal: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._signal = signal
        self._clock = clock
        self._level = 0
        self._calm_since: float | None = None
        self._next_refresh = float("-inf")
        self._last_update = float("-inf")
        self.score = 0.0

    def level(self) -> int:
        """The level to apply to a request arriving now."""
        if not self.config.enabled:
            return 0
        now = self._clock()
        if now >= self._next_refresh:
            self._next_refresh = now + self.config.refresh_seconds
            self.score = self._signal()
            self._update(now)
        return self._level

    def _update(self, now: float) -> None:
        last, self._last_update = self._last_update, now
        target = sum(1 for threshold in self.config.thresholds if self.score >= threshold)
        if target > self._level:
            self._level = target
            self._calm_since = None
        elif self._is_calm():
            cooldown = self.config.cooldown_seconds
            if self._calm_since is None:
                # Nobody asked for a whole window before this (no request, no scrape): what the
                # score reads now, over its windows, is how that gap went. Dated from its start,
                # so an idle server steps down as if watched, instead of giving the first request
                # after a quiet hour the level of the burst before it (a canned reply).
                self._calm_since = last if now - last >= cooldown else now
            while self._is_calm() and now - self._calm_since >= cooldown:
                self._level -= 1
                self._calm_since += cooldown  # the next step down needs its own calm window
        else:
            self._calm_since = None

    def _is_calm(self) -> bool:
        """Whether the score is below the current level's threshold, less the hysteresis."""
        thresholds = self.config.thresholds
        return bool(self._level) and self.score < thresholds[self._level - 1] * (1.0 - self.config.hysteresis)


class TierLevels:
    """A level per tier: one `Degrader` (its own hysteresis) per tier seen, each scoring the worst
    of `signal(t)` over its tier and the tiers above it. `signal(tier)`: that tier's load score
    from the samples of that tier and the tiers above it."""

    def __init__(
        self,
        config: DegradationConfig,
        signal: Callable[[int], float],
        clock: Callable[[], float] = time.monotonic,
        tiers: Iterable[int] = (0,),
    ) -> None:
        """`tiers`: the tiers known up front (the keys file's, and 0), reported from the start."""
        self.config = config
        self._signal = signal
        self._clock = clock
        self._degraders: dict[int, Degrader] = {}
        for tier in tiers:
            self._add(tier)

    def level(self, tier: int) -> int:
        """The level to apply to a request of `tier` arriving now."""
        degrader = self._degraders.get(tier)
        if degrader is None:  # tiers come from the keys file: a handful, added once each
            degrader = self._add(tier)
        return degrader.level()

    def levels(self) -> dict[int, int]:
        """Every known tier's level, most important first."""
        return {tier: self.level(tier) for tier in sorted(self._degraders)}

    def _add(self, tier: int) -> Degrader:
        degrader = self._degraders[tier] = Degrader(self.config, functools.partial(self._score, tier), self._clock)
        return degrader

    def _score(self, tier: int) -> float:
        return max(self._signal(t) for t in self._degraders if t <= tier)
