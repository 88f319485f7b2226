"""scripts/load_memory.py on the tiny model: a row per configuration, each load's figures read
from its own process."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.load_memory import CONFIGURATIONS, main


def test_reports_each_configurations_peak_and_kept_memory(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--model", str(tiny_model_dir)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [tuple(cell.strip() for cell in row.strip("|").split("|")[:2]) for row in rows] == CONFIGURATIONS
    for row in rows:
        peak_anon, _, peak_rss, kept, seconds = (float(cell.replace(",", "")) for cell in row.strip("|").split("|")[2:])
        assert 0 <= kept <= peak_anon + 1 and peak_rss > 0 and seconds > 0, row
