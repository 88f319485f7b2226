"""scripts/bench_engine.py end to end on the small model: both runners serve the same closed
loop (same arrivals, so the same number of steps) and the report gives their ratio."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_packed_and_split_runners_serve_the_same_loop(tiny_model_dir: Path) -> None:
    argv = [sys.executable, "-m", "scripts.bench_engine", "--model-dir", str(tiny_model_dir)]
    argv += ["--concurrency", "4", "--requests", "8", "--max-tokens", "6", "--rounds", "1", "--ramp", "1"]
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = dict(re.findall(r"^\| (packed|split) \| (.*) \|$", proc.stdout, re.MULTILINE))
    assert set(rows) == {"packed", "split"}, proc.stdout
    cells = {name: [float(c) for c in row.split(" | ")] for name, row in rows.items()}
    assert all(c[0] > 0 for c in cells.values())  # tokens/s
    assert cells["packed"][2] == cells["split"][2]  # steps: the scheduler plans alike for both
    assert re.search(r"^packed / split tokens/s per round: \d+\.\d+x$", proc.stdout, re.MULTILINE)
