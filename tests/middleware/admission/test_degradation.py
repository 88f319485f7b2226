"""Degradation levels from a synthetic load signal and an injectable clock."""

from __future__ import annotations

import pytest

from middleware.admission.degradation import DegradationConfig, Degrader, TierLevels, load_score
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
    clock.now = 10.0
    assert levels.levels() == {0: 2, 1: 2, 2: 4}  # calm starts now, each tier on its own hysteresis
    clock.now = 20.0
    assert levels.levels() == {0: 1, 1: 1, 2: 3}


def test_the_kv_cache_counts_only_for_the_tier_that_bears_the_shared_load() -> None:
    config = DegradationConfig()
    snap = LoadSnapshot(0, 4, 4, 0.0, 0.0, 0.0, kv_usage=1.0, num_waiting_tokens=0)
    assert load_score(snap, config) == 1.0
    assert load_score(LoadSnapshot(0, 4, 4, 0.0, 0.0, 0.0, 1.0, 0, bears_shared_load=False), config) == 0.0
