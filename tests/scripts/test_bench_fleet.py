"""scripts/bench_fleet.py end to end at its smallest: two replicas of the tiny `s` model, vllm-router
under every policy, a few conversations: every pass answers, and the report has a row per policy
and round with the later turns' hit share."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import bench_fleet
from tests.app.test_fleet_router import ROUTER


@pytest.mark.skipif(ROUTER is None, reason="vllm-router is not installed (pip install vllm-router)")
def test_a_small_fleet_run_reports_every_policy(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fleet.md"
    argv = ["--model-dir", str(tiny_model_dir), "--model-size", "s", "--conversations", "3", "--turns", "2"]
    argv += [
        "--prefix-tokens",
        "200",
        "--max-tokens",
        "4",
        "--max-model-len",
        "1024",
        "--rounds",
        "1",
        "--out",
        str(out),
    ]
    bench_fleet.main(argv)
    text = out.read_text()
    for policy in bench_fleet.POLICIES:
        row = next(line for line in text.splitlines() if line.startswith(f"| {policy} |"))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[2].endswith("%") and cells[-1] == "0", row  # a hit share, no errors
