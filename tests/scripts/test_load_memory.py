"""scripts/load_memory.py on the tiny model: a row per configuration asked for, each load's
figures read from its own process (two of the four: each is a process importing torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.load_memory import main

CONFIGURATIONS = [("float32", "none"), ("bfloat16", "int8")]


def test_reports_each_configurations_peak_and_kept_memory(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = ",".join(f"{dtype}/{quantization}" for dtype, quantization in CONFIGURATIONS)
    assert main(["--model", str(tiny_model_dir), "--configurations", asked]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [tuple(cell.strip() for cell in row.strip("|").split("|")[:2]) for row in rows] == CONFIGURATIONS
    for row in rows:
        cells = (float(cell.replace(",", "")) for cell in row.strip("|").split("|")[2:])
        peak_anon, _, peak_rss, kept, kept_rss, seconds = cells
        assert 0 <= kept <= peak_anon + 1 and kept <= kept_rss + 16 <= peak_rss + 16 and seconds > 0, row
