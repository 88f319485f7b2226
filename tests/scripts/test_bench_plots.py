"""scripts/benchkit/plots.py: the PNGs of a bench run, from a small synthetic result set (no servers)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytest.importorskip("matplotlib")  # the `bench` extra; `make test` does not install it


@pytest.fixture(scope="module")
def plots() -> ModuleType:
    from scripts.benchkit import plots

    return plots


ROWS = [
    {"system": "ceiling", "concurrency": 1, "tokens_per_s": 150.0},
    {"system": "ceiling", "concurrency": 8, "tokens_per_s": 640.0},
    {"system": "surge", "concurrency": 1, "tokens_per_s": 120.0, "ttft_p99_s": 0.02, "num_requests": 2},
    {"system": "surge", "concurrency": 8, "tokens_per_s": 520.0, "ttft_p99_s": 0.09, "num_requests": 16},
    {"system": "naive", "concurrency": 8, "tokens_per_s": 110.0, "ttft_p99_s": 3.5, "num_requests": 16},
    # a failed start and an open-loop row: neither is plotted
    {"system": "transformers", "concurrency": 8, "tokens_per_s": 0.0, "num_requests": 1, "num_errors": 1},
    {"system": "surge", "concurrency": None, "load": "poisson 5/s", "tokens_per_s": 300.0, "num_requests": 50},
]


def test_write_plots_writes_valid_pngs(plots: ModuleType, tmp_path: Path) -> None:
    written = plots.write_plots(ROWS, tmp_path / "out", title="tiny-s")
    assert [p.name for p in written] == ["throughput.png", "ttft_p99.png"]
    for path in written:
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
        assert data[12:16] == b"IHDR"


def test_series_keeps_closed_loop_rows_that_ran(plots: ModuleType) -> None:
    throughput = plots.series(ROWS, "tokens_per_s")
    assert throughput == {
        "ceiling": [(1, 150.0), (8, 640.0)],
        "surge": [(1, 120.0), (8, 520.0)],
        "naive": [(8, 110.0)],
    }
    assert "ceiling" not in plots.series(ROWS, "ttft_p99_s")


def test_log_axis_only_when_the_values_span_decades(plots: ModuleType) -> None:
    # TTFT p99 of surge (ms) beside the naive server's (seconds): a linear axis flattens surge.
    assert plots.spans_decades([0.02, 0.09, 3.5])
    assert not plots.spans_decades([120.0, 520.0, 640.0])
    assert not plots.spans_decades([0.0, 3.5])  # a zero has no place on a log axis
    assert not plots.spans_decades([3.5])
