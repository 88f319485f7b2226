"""`scripts/bench.py --stack`: one surge per traffic-stack mode, rows `surge[MODE]`, ratios against `off`.

The end-to-end test starts real servers (and a real `redis-server` where one is installed); the
others load the script as a module and need no server.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_smoke_stack_writes_a_row_per_mode_without_errors(tmp_path: Path) -> None:
    # Two servers, not three (CI time): `memory` stands in for `redis` only where there is no Redis;
    # the in-process store's paths have their own tests under tests/middleware and tests/app.
    modes = ["off", "redis" if shutil.which("redis-server") else "memory"]
    out = tmp_path / "bench.md"
    argv = [sys.executable, "scripts/bench.py", "--smoke", "--stack", ",".join(modes), "--no-ceiling"]
    proc = subprocess.run(
        [*argv, "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=280, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    text = out.read_text()
    assert "### vs stack off" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| system |"))
    titles = [cell.strip() for cell in header.strip("|").split("|")]
    for mode in modes:
        # The first `surge[MODE]` line is the main table's; the second is the "vs stack off" section's.
        line = next(line for line in lines if line.startswith(f"| surge[{mode}] |"))
        row = dict(zip(titles, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        assert float(row["tokens/s"]) > 0, row
        assert row["errors"] == "0", row

    rows = {r["system"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert sorted(rows) == sorted(f"surge[{mode}]" for mode in modes)
    for mode in modes:
        row = rows[f"surge[{mode}]"]
        assert row["stack"] == mode and row["num_errors"] == 0 and row["completion_tokens"] == 4 * 8, row
        assert row["vs_off_tokens_per_s"] > 0, row
    assert rows["surge[off]"]["vs_off_tokens_per_s"] == 1.0
    if "redis" in modes:
        assert rows["surge[redis]"]["redis_commands"] > 0  # the mode really went through Redis


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
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    args = bench.parse_args(["--smoke", "--stack", "redis", "--out", str(tmp_path / "bench.md")])
    sut = bench.surge_server(tmp_path / "no-model", 4, args, args.stack[0])
    row, _ = bench.measure(sut, bench.LoadSpec(4, 1, 8, 8))
    assert row["system"] == "surge[redis]" and row["num_errors"] == 1
    assert "redis-server is not installed" in row["errors"][0]
    assert sut.proc is None  # surge itself was never started
