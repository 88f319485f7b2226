"""Sliding-window load figures (models/load/stats.py), on an injected clock."""

from __future__ import annotations

import pytest

from models.load.stats import MIN_FINISHES_FOR_ERROR_RATE, MIN_STEPS, LoadStats


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_failed_request_on_a_quiet_server_is_not_an_error_rate() -> None:
    # Regression: one failed forward pass made the error rate 1.0, the load score 5 and the
    # whole server answer canned level-3 replies for half a minute.
    stats = LoadStats(clock=Clock())
    stats.record_finish(is_error=True)
    for _ in range(MIN_FINISHES_FOR_ERROR_RATE - 2):
        stats.record_finish(is_error=False)
    assert stats.window()[2] == 0.0


def test_the_error_rate_counts_once_enough_requests_finished_in_the_window() -> None:
    clock = Clock()
    stats = LoadStats(window_seconds=30.0, clock=clock)
    for i in range(MIN_FINISHES_FOR_ERROR_RATE):
        stats.record_finish(is_error=i % 4 == 0)
    assert stats.window()[2] == 0.25
    clock.now = 31.0  # all of them out of the window
    stats.record_finish(is_error=True)
    assert stats.window()[2] == 0.0


def test_the_floor_can_be_lowered_to_one() -> None:
    stats = LoadStats(clock=Clock(), min_finishes=1)
    stats.record_finish(is_error=True)
    assert stats.window()[2] == 1.0


def test_the_window_is_computed_at_most_once_per_max_age() -> None:
    """Regression: every admission and every 503's Retry-After sorted the whole window (thousands
    of samples under load), ~15% of the HTTP process's CPU per request. A result now serves for
    `max_age_seconds`; after that the window is read afresh."""
    clock = Clock()
    stats = LoadStats(clock=clock, max_age_seconds=0.1)
    stats.record_queue_time(1.0)
    assert stats.window()[0] == 1.0
    for _ in range(20):
        stats.record_queue_time(5.0)
    clock.now = 0.05
    assert stats.window()[0] == 1.0  # within max_age: the earlier result
    clock.now = 0.1
    assert stats.window()[0] == pytest.approx(5.0, rel=0.02)  # the p90 of 1.0 and twenty 5.0s (faded 0.1 s)


def test_a_tier_sees_its_own_and_the_more_important_tiers_samples_never_a_lower_ones() -> None:
    clock = Clock()
    stats = LoadStats(clock=clock, max_age_seconds=0.0, min_finishes=1)
    stats.record_queue_time(30.0, tier=2)  # the lowest tier waited half a minute and failed
    stats.record_finish(True, tier=2)
    stats.record_queue_time(0.5, tier=0)
    stats.record_finish(False, tier=0)
    assert stats.window(0) == (0.5, 0.0, 0.0)
    assert stats.window(1) == (0.5, 0.0, 0.0)  # no tier-1 samples: tier 0's
    assert stats.window(2) == (30.0, 0.0, 0.5)
    assert stats.window() == (30.0, 0.0, 0.5)  # every tier
    stats.record_ttft(4.0, tier=-1)  # a tier above tier 0 counts for it
    assert stats.window(0)[1] == 4.0


def test_a_past_wait_fades_instead_of_holding_the_p90_for_the_whole_window() -> None:
    """Regression (issue 34): one slow request's samples held the p90, and so the degradation level,
    for the whole 30 s window and the cooldown after it, long after the load had gone."""
    clock = Clock()
    stats = LoadStats(window_seconds=30.0, clock=clock, max_age_seconds=0.0)
    stats.record_queue_time(20.0)
    stats.record_ttft(20.0)
    assert stats.window()[:2] == (20.0, 20.0)
    clock.now = 5.0
    assert stats.window()[:2] == pytest.approx((10.0, 10.0))  # one half-life later
    clock.now = 20.0
    assert stats.window()[0] < 2.0  # under --degrade-queue-seconds' default: no level from it
    no_fading = LoadStats(window_seconds=30.0, clock=clock, max_age_seconds=0.0, half_life_seconds=None)
    no_fading.record_queue_time(20.0)
    clock.now = 40.0
    assert no_fading.window()[0] == 20.0


def test_requests_still_waiting_count_with_their_wait_so_far() -> None:
    clock = Clock()
    stats = LoadStats(clock=clock, max_age_seconds=0.0)
    clock.now = 10.0
    assert stats.window(0, lambda: [1.0])[0] == 9.0  # waiting since t=1: nothing admitted yet, still load
    assert stats.window(0)[0] == 0.0


def test_the_step_time_is_the_windows_p90_once_enough_steps_ran_and_fades_when_idle() -> None:
    clock = Clock()
    stats = LoadStats(window_seconds=30.0, clock=clock, max_age_seconds=0.0)
    for _ in range(MIN_STEPS - 1):
        stats.record_step(0.3)
    assert stats.step_time_p90() == 0.0  # too few steps: one slow start is not a slow engine
    stats.record_step(0.3)
    assert stats.step_time_p90() == pytest.approx(0.3)
    for _ in range(10 * MIN_STEPS):
        stats.record_step(0.01)
    assert stats.step_time_p90() == pytest.approx(0.01)  # under a tenth slow: the p90 is a fast step
    clock.now = 31.0  # idle since: no step in the window
    assert stats.step_time_p90() == 0.0
