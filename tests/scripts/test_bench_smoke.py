"""`scripts/bench.py --smoke --stack` end to end: builds the `s` model, measures the ceiling, starts
a real `surge serve` per traffic-stack mode (and a real `redis-server` where one is installed),
streams a few requests through each and writes the table and the JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_smoke_measures_the_ceiling_and_a_surge_row_per_stack_mode(tmp_path: Path) -> None:
    """One run for two checks (CI's time): the smoke benchmark (ceiling, a real surge, table and
    JSON) and `--stack` (a row per traffic-stack mode, ratios against `off`)."""
    modes = ["off", "redis" if shutil.which("redis-server") else "memory"]
    out = tmp_path / "bench.md"
    argv = [sys.executable, "-m", "scripts.bench", "--smoke", "--stack", ",".join(modes), "--out", str(out)]
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=280, check=False)
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
    assert sorted(rows) == sorted(["ceiling", *(f"surge[{mode}]" for mode in modes)])
    assert rows["ceiling"]["tokens_per_s"] > 0
    for mode in modes:
        row = rows[f"surge[{mode}]"]
        assert row["stack"] == mode and row["num_errors"] == 0 and row["completion_tokens"] == 4 * 8, row
        assert row["vs_off_tokens_per_s"] > 0 and row["vs_ceiling"] > 0, row
    assert rows["surge[off]"]["vs_off_tokens_per_s"] == 1.0
    if "redis" in modes:
        assert rows["surge[redis]"]["redis_commands"] > 0  # the mode really went through Redis
