"""LoadStats keeps only its window, whether or not anyone reads it."""

from __future__ import annotations

from models.load.stats import LoadStats


def test_unread_load_stats_stay_bounded_by_the_window() -> None:
    """Regression (soak, tracemalloc of the engine process: models/load/stats.py +20,000 blocks
    per site in 20 minutes): entries were dropped only by `window()`, which the engine process
    never calls on its own LoadStats (the server reads the one it keeps), so it grew forever."""
    now = [0.0]
    stats = LoadStats(window_seconds=30.0, clock=lambda: now[0], half_life_seconds=None)
    for step in range(10_000):  # 10 requests a second for 1000 s, never read
        now[0] = step / 10
        stats.record_queue_time(0.1)
        stats.record_ttft(0.2)
        stats.record_finish(is_error=False)
    held = [len(stats._queue_times[0]), len(stats._ttfts[0]), len(stats._finishes[0])]
    assert all(n <= 301 for n in held), held  # 30 s at 10 a second
    queue_p90, ttft_p90, error_rate = stats.window()
    assert (queue_p90, ttft_p90, error_rate) == (0.1, 0.2, 0.0)


def test_a_flood_keeps_only_the_newest_events_of_the_window() -> None:
    # 1,000 requests a second: the 30 s window would hold 30,000 of each, sorted on each read.
    now = [0.0]
    stats = LoadStats(window_seconds=30.0, clock=lambda: now[0], max_events=100, half_life_seconds=None)
    for i in range(30_000):
        now[0] = i / 1000
        slow = i >= 29_950  # the newest 50: slow and failed
        stats.record_queue_time(5.0 if slow else 0.01)
        stats.record_ttft(6.0 if slow else 0.02)
        stats.record_finish(is_error=slow)
    assert [len(stats._queue_times[0]), len(stats._ttfts[0]), len(stats._finishes[0])] == [100, 100, 100]
    # Over the newest 100: half slow, so the p90 is slow; half failed.
    assert stats.window() == (5.0, 6.0, 0.5)
