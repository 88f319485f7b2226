"""`scripts/bench.py --stack`: one surge per traffic-stack mode, rows `surge[MODE]`, ratios against `off`.

These load the script as a module and need no server; the end-to-end `--smoke --stack` run is
tests/scripts/test_bench_smoke.py (one run for both, for CI's time).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

import pytest


def test_stack_flag_rejects_unknown_and_repeated_modes(bench: ModuleType) -> None:
    assert [mode.name for mode in bench.parse_args(["--stack", "redis,off"]).stack] == ["redis", "off"]
    assert bench.parse_args([]).stack is None  # the plain run: one `surge` row at the server's defaults
    for bad in ("fast", "off,off", ","):
        with pytest.raises(SystemExit):
            bench.parse_args(["--stack", bad])


def test_vs_off_ratios_compare_modes_at_the_same_concurrency(bench: ModuleType) -> None:
    rows = [
        {"stack": "off", "concurrency": 8, "tokens_per_s": 100.0, "ttft_p50_s": 0.2, "num_requests": 8},
        {"stack": "memory", "concurrency": 8, "tokens_per_s": 90.0, "ttft_p50_s": 0.3, "num_requests": 8},
        {"stack": "memory", "concurrency": 32, "tokens_per_s": 300.0, "ttft_p50_s": 0.5, "num_requests": 32},
        {"stack": "redis", "concurrency": 8, "tokens_per_s": 0.0, "num_requests": 1, "num_errors": 1},
    ]
    bench.add_vs_off(rows)
    assert rows[1]["vs_off_tokens_per_s"] == pytest.approx(0.9)
    assert rows[1]["vs_off_ttft_p50"] == pytest.approx(1.5)
    assert "vs_off_tokens_per_s" not in rows[2]  # no `off` row at concurrency 32
    assert "vs_off_tokens_per_s" not in rows[3]  # a mode that never ran has no ratio


def test_redis_mode_without_redis_server_is_an_error_row(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # redis-server looked up at start
    args = bench.parse_args(["--smoke", "--stack", "redis", "--out", str(tmp_path / "bench.md")])
    sut = bench.surge_server(tmp_path / "no-model", 4, args, args.stack[0])
    row, _ = bench.measure(sut, bench.LoadSpec(4, 1, 8, 8))
    assert row["system"] == "surge[redis]" and row["num_errors"] == 1
    assert "redis-server is not installed" in row["errors"][0]
    assert sut.process is None  # surge itself was never started
