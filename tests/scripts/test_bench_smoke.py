"""`scripts/bench.py --smoke` end to end: builds the `s` model, measures the ceiling, starts a real
`surge serve`, streams a few requests through it and writes the table and the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_smoke_writes_a_surge_row_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, "scripts/bench.py", "--smoke", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    text = out.read_text()
    assert "vs stack off" not in text  # only `--stack` runs compare modes
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| system |"))
    titles = [cell.strip() for cell in header.strip("|").split("|")]
    surge_rows = [line for line in lines if line.startswith("| surge |")]
    assert len(surge_rows) == 1, lines
    row = dict(zip(titles, (cell.strip() for cell in surge_rows[0].strip("|").split("|")), strict=True))
    assert float(row["tokens/s"]) > 0
    assert row["errors"] == "0"

    report = json.loads(out.with_suffix(".json").read_text())
    (surge,) = [r for r in report["rows"] if r["system"] == "surge"]
    assert surge["num_errors"] == 0 and surge["completion_tokens"] == 4 * 8
    assert any(r["system"] == "ceiling" and r["tokens_per_s"] > 0 for r in report["rows"])
