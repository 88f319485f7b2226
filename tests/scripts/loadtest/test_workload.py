"""The load tester's workload: ranges, seeded plans, duplicates, Poisson arrivals (pure, no server)."""

from __future__ import annotations

import pytest

from scripts.loadtest.workload import IntRange, RequestPlan, Workload, WorkloadSpec, poisson_arrivals


def test_int_range_parses_a_value_or_bounds_and_rejects_nonsense() -> None:
    assert IntRange.parse("32") == IntRange(32, 32)
    assert IntRange.parse("16:128") == IntRange(16, 128)
    for bad in ("0", "8:4", "x", "1:y"):
        with pytest.raises(ValueError):
            IntRange.parse(bad)


def test_plans_are_seeded_within_their_ranges_and_distinct() -> None:
    spec = WorkloadSpec(IntRange(4, 8), IntRange(16, 32), seed=7)
    plans = _take(Workload(spec), 50)
    assert plans == _take(Workload(spec), 50)
    # Each prompt is "RUN-N: word word ...": the run id and a serial number, then 4 to 8 words.
    assert all(16 <= p.max_tokens <= 32 and 4 <= len(p.prompt.split()) - 1 <= 8 for p in plans)
    assert len({p.prompt for p in plans}) == 50 and not any(p.is_duplicate for p in plans)


def test_runs_with_the_same_seed_differ_only_by_their_run_id() -> None:
    first = _take(Workload(WorkloadSpec(IntRange(4, 8), IntRange(16, 32), run_id="aaaa")), 20)
    second = _take(Workload(WorkloadSpec(IntRange(4, 8), IntRange(16, 32), run_id="bbbb")), 20)
    assert [p.max_tokens for p in first] == [p.max_tokens for p in second]
    assert not {p.prompt for p in first} & {p.prompt for p in second}  # no dedup across runs


def test_duplicates_repeat_an_earlier_request_exactly() -> None:
    plans = _take(Workload(WorkloadSpec(IntRange(4, 8), IntRange(16, 32), duplicate_fraction=0.5)), 200)
    duplicates = [p for p in plans if p.is_duplicate]
    originals = {(p.prompt, p.max_tokens) for p in plans if not p.is_duplicate}
    assert 60 <= len(duplicates) <= 140 and not plans[0].is_duplicate
    assert all((p.prompt, p.max_tokens) in originals for p in duplicates)


def test_poisson_arrivals_average_the_rate() -> None:
    offsets = poisson_arrivals(rate=50.0, duration_s=20.0, seed=1)
    assert offsets == sorted(offsets) and offsets[0] >= 0 and offsets[-1] < 20.0
    assert 900 <= len(offsets) <= 1100  # 1000 expected; the spread of a Poisson count is about 32


def _take(workload: Workload, count: int) -> list[RequestPlan]:
    return [workload.next_plan() for _ in range(count)]
