"""Sliding-window load figures (models/load_stats.py), on an injected clock."""

from __future__ import annotations

from models.load_stats import MIN_FINISHES_FOR_ERROR_RATE, LoadStats


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
    assert stats.window()[0] == 5.0  # the p90 of 1.0 and twenty 5.0s
