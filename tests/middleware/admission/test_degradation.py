"""Degradation levels from a synthetic load signal and an injectable clock."""

from __future__ import annotations

import dataclasses

import pytest

from middleware.admission.degradation import DegradationConfig, Degrader, TierLevels, load_score, load_signals
from models.load.stats import LoadSnapshot


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(cooldown: float = 10.0) -> tuple[Degrader, Clock, list[float]]:
    clock = Clock()
    score = [0.0]
    config = DegradationConfig(cooldown_seconds=cooldown, refresh_seconds=0.0)
    return Degrader(config, lambda: score[0], clock), clock, score


def test_steps_up_at_once_to_the_level_of_the_score() -> None:
    degrader, _, score = make()
    assert degrader.level() == 0
    for value, level in [(0.99, 0), (1.0, 1), (2.5, 2), (9.0, 4), (3.0, 4)]:
        score[0] = value
        assert degrader.level() == level


def test_steps_down_one_level_per_calm_window() -> None:
    degrader, clock, score = make(cooldown=10.0)
    score[0] = 8.0
    assert degrader.level() == 4
    score[0] = 0.0
    assert degrader.level() == 4  # calm starts now
    clock.now = 9.9
    assert degrader.level() == 4
    clock.now = 10.0
    assert degrader.level() == 3
    clock.now = 15.0
    assert degrader.level() == 3
    clock.now = 20.0
    assert degrader.level() == 2


def test_a_server_nobody_asked_during_a_calm_gap_has_stepped_down_by_its_length() -> None:
    """A burst leaves level 4; nothing asks for 25 s (no request, no scrape), and the score reads
    calm: the gap counts as two calm windows, so the first request after it sees level 2, not 4,
    and the rest of the way down goes one window per level as usual. A gap shorter than a window
    proves nothing: the calm starts when it is seen."""
    degrader, clock, score = make(cooldown=10.0)
    walk = [(0.0, 8.0, 4), (25.0, 0.0, 2), (29.9, 0.0, 2), (30.0, 0.0, 1)]
    walk += [(30.0, 8.0, 4), (39.0, 0.0, 4), (48.9, 0.0, 4), (49.0, 0.0, 3)]
    seen = []
    for clock.now, score[0], _ in walk:
        seen.append(degrader.level())
    assert seen == [level for *_, level in walk]


def test_a_gap_whose_score_is_still_high_steps_nothing_down() -> None:
    degrader, clock, score = make(cooldown=10.0)
    score[0] = 8.0
    assert degrader.level() == 4
    score[0] = 5.0  # below level 4's 8 x 0.8, above level 3's 4 x 0.8: one level down at most
    clock.now = 60.0
    assert degrader.level() == 3


def test_a_spike_during_the_calm_window_restarts_it() -> None:
    degrader, clock, score = make(cooldown=10.0)
    score[0] = 2.0
    assert degrader.level() == 2
    score[0] = 0.5
    assert degrader.level() == 2
    clock.now = 6.0
    score[0] = 2.0  # back at level 2's load: the calm is broken
    assert degrader.level() == 2
    score[0] = 0.5
    clock.now = 12.0
    assert degrader.level() == 2  # only 6 s calm since the spike
    clock.now = 22.0
    assert degrader.level() == 1


def test_refresh_interval_caches_the_score() -> None:
    clock = Clock()
    calls = []

    def signal() -> float:
        calls.append(clock.now)
        return 0.0

    degrader = Degrader(DegradationConfig(refresh_seconds=1.0), signal, clock)
    for t in (0.0, 0.5, 0.9, 1.0, 1.5):
        clock.now = t
        degrader.level()
    assert calls == [0.0, 1.0]


def test_disabled_is_always_level_zero() -> None:
    degrader = Degrader(DegradationConfig(thresholds=()), lambda: 100.0)
    assert degrader.level() == 0


def test_load_score_is_the_worst_ratio() -> None:
    config = DegradationConfig(queue_depth=10, queue_seconds=2.0, ttft_seconds=4.0, error_rate=0.1)
    snap = LoadSnapshot(
        num_waiting=5,
        num_running=3,
        max_num_seqs=4,
        queue_time_p90=1.0,
        ttft_p90=10.0,
        error_rate=0.05,
        kv_usage=0.3,
        num_waiting_tokens=50,
    )
    assert load_score(snap, config) == pytest.approx(2.5)  # TTFT 10 s / 4 s


@pytest.mark.parametrize("thresholds", [(1.0, 2.0), (1.0, 1.0, 2.0, 3.0), (4.0, 3.0, 2.0, 1.0)])
def test_bad_thresholds_are_rejected(thresholds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        DegradationConfig(thresholds=thresholds)


def test_a_low_tiers_load_never_degrades_a_more_important_tier() -> None:
    """The attack (issue 34): one tier-2 fan-out request drove the one server-wide level to 4, and
    tier-0 requests lost logprobs and were clamped or shed. Each tier now has its own level, from
    its own load and the more important tiers'."""
    clock = Clock()
    scores = {0: 0.0, 2: 9.0}
    config = DegradationConfig(cooldown_seconds=10.0, refresh_seconds=0.0)
    levels = TierLevels(config, lambda tier: scores.get(tier, 0.0), clock, tiers=(0, 2))
    assert levels.levels() == {0: 0, 2: 4}
    assert levels.level(1) == 0  # a tier seen later: tier 0's load is all it sees
    scores[0] = 2.0  # tier 0's own load degrades every tier below it too
    assert levels.levels() == {0: 2, 1: 2, 2: 4}
    scores.update({0: 0.0, 2: 0.0})
    clock.now = 5.0
    assert levels.levels() == {0: 2, 1: 2, 2: 4}  # calm starts now, each tier on its own hysteresis
    clock.now = 15.0
    assert levels.levels() == {0: 1, 1: 1, 2: 3}


def test_the_kv_cache_counts_only_for_the_tier_that_bears_the_shared_load() -> None:
    config = DegradationConfig()
    snap = LoadSnapshot(0, 4, 4, 0.0, 0.0, 0.0, kv_usage=0.9, num_waiting_tokens=0)
    assert load_score(snap, config) == pytest.approx(1.0)  # at its bound: 90% of the pool
    assert load_score(LoadSnapshot(0, 4, 4, 0.0, 0.0, 0.0, 1.0, 0, bears_shared_load=False), config) == 0.0


def test_a_level_closes_only_below_its_threshold_less_the_hysteresis() -> None:
    """A score hovering just under a threshold must not flap the level: level 1 (threshold 1.0)
    stays while the score is above 0.8, and closes a cooldown after it falls below."""
    degrader, clock, score = make(cooldown=10.0)
    score[0] = 1.0
    assert degrader.level() == 1
    score[0] = 0.85  # under the threshold, inside the band
    for clock.now in (5.0, 15.0, 30.0):
        assert degrader.level() == 1
    score[0] = 0.79
    assert degrader.level() == 1  # calm starts now
    clock.now = 40.0
    assert degrader.level() == 0
    flapping = [1.0]
    without = Degrader(
        DegradationConfig(cooldown_seconds=10.0, refresh_seconds=0.0, hysteresis=0.0), lambda: flapping[0], clock
    )
    assert without.level() == 1
    flapping[0] = 0.85  # with no band, just under the threshold is calm enough
    assert without.level() == 1
    clock.now = 50.0
    assert without.level() == 0


ENGINE_SNAPSHOT = LoadSnapshot(
    num_waiting=0,
    num_running=4,
    max_num_seqs=4,
    queue_time_p90=0.0,
    ttft_p90=0.0,
    error_rate=0.0,
    kv_usage=0.45,
    num_waiting_tokens=0,
    step_time_p90=0.5,
    memory_usage=0.72,
    compute_usage=0.99,
)


def test_the_engines_signals_are_ratios_to_their_bounds() -> None:
    config = DegradationConfig(step_seconds=0.25, kv_usage=0.9, memory_usage=0.9, compute_usage=0.9)
    signals = load_signals(ENGINE_SNAPSHOT, config)
    assert signals["step_time"] == pytest.approx(2.0) and signals["kv_usage"] == pytest.approx(0.5)
    assert signals["memory"] == pytest.approx(0.8) and signals["compute"] == pytest.approx(1.1)
    assert load_score(ENGINE_SNAPSHOT, config) == pytest.approx(2.0)  # a 500 ms step: level 2
    assert set(signals) == {
        "queue_depth",
        "queue_time",
        "ttft",
        "error_rate",
        "step_time",
        "kv_usage",
        "memory",
        "compute",
    }


def test_a_bound_of_zero_turns_a_signal_off_and_compute_is_off_by_default() -> None:
    assert load_signals(ENGINE_SNAPSHOT, DegradationConfig())["compute"] == 0.0
    off = DegradationConfig(step_seconds=0, kv_usage=0, memory_usage=0)
    assert load_score(ENGINE_SNAPSHOT, off) == 0.0


def test_the_step_bound_is_at_least_a_multiple_of_the_engines_own_full_load_step() -> None:
    """A big model on a small CPU: its full 32-row step at warmup took 0.8 s, so 1.0 s steps are its
    normal pace, not 5x overload (which was level 3, canned replies, with the fixed 0.2 s alone)."""
    big = dataclasses.replace(ENGINE_SNAPSHOT, step_time_p90=1.0, full_step_seconds=0.8)
    assert load_signals(big, DegradationConfig())["step_time"] == pytest.approx(1.0 / 1.6)
    assert load_signals(big, DegradationConfig(full_step_factor=0))["step_time"] == pytest.approx(5.0)
    slower = dataclasses.replace(big, step_time_p90=3.2)  # 4x its own pace: overloaded after all
    assert load_signals(slower, DegradationConfig())["step_time"] == pytest.approx(2.0)
    # A fast engine (or one that reported nothing) keeps the fixed bound.
    small = dataclasses.replace(ENGINE_SNAPSHOT, full_step_seconds=0.01)
    assert load_signals(small, DegradationConfig(step_seconds=0.25))["step_time"] == pytest.approx(2.0)
    assert load_signals(big, DegradationConfig(step_seconds=0))["step_time"] == 0.0  # off stays off


def test_the_engines_signals_count_only_for_the_tier_that_bears_the_shared_load() -> None:
    config = DegradationConfig(compute_usage=0.9)
    spared = dataclasses.replace(ENGINE_SNAPSHOT, bears_shared_load=False)
    assert load_score(spared, config) == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        {"step_seconds": -0.1},
        {"full_step_factor": -1.0},
        {"memory_usage": -1.0},
        {"hysteresis": 1.0},
        {"hysteresis": -0.1},
    ],
)
def test_bad_engine_bounds_are_rejected(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DegradationConfig(**bad)  # type: ignore[arg-type]
