"""scripts/harness/stats.py: the one percentile."""

from __future__ import annotations

import pytest

from scripts.harness.stats import percentile


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0], 0) == 1.0 and percentile([1.0, 2.0], 100) == 2.0


def test_percentile_takes_percent_not_more_than_100() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)
