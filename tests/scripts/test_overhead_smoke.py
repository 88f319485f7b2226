"""`scripts/overhead.py --smoke` end to end: a real `surge serve --model echo` and the bare
Starlette server, each streaming a few requests, and a table with a row for each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_overhead_smoke_measures_surge_and_bare(tmp_path: Path) -> None:
    out = tmp_path / "overhead.md"
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.overhead", "--smoke", "--out", str(out), "--log-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = out.read_text().splitlines()
    header = next(line for line in lines if line.startswith("| server |"))
    titles = [cell.strip() for cell in header.strip("|").split("|")]
    rows = {}
    for line in lines:
        if line.startswith(("| surge |", "| bare |")):
            row = dict(zip(titles, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
            rows[row["server"]] = row
    assert set(rows) == {"surge", "bare"}, lines
    for row in rows.values():
        assert float(row["events/s"]) > 0
        assert row["errors"] == "0"
        assert int(row["events"]) == 4 * (16 + 3)  # role, 16 tokens, finish, [DONE] per request
    assert any(line.startswith("surge / bare:") for line in lines)
