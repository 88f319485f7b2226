"""scripts/bench_grammar.py runs on the tiny tokenizer and reports llguidance's figures."""

from __future__ import annotations

import re

import pytest

from scripts import bench_grammar


def test_the_llguidance_row_has_figures_and_no_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_grammar.main(["--steps", "60"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| llguidance"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert all(re.fullmatch(r"[0-9.]+", cell) for cell in (cells[1], cells[4])), row
    assert re.fullmatch(r"[0-9.]+ / [0-9.]+", cells[3]), row
    assert cells[5].endswith("(0 errors)"), row
