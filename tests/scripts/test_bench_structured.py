"""`scripts/bench.py --structured` end to end on the `s` model: a real surge, plain against half
json_schema rounds, mask time from surge's own histograms, and the new-schema probe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_structured_bench_reports_ratio_mask_time_and_the_probe(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "structured.md"
    # The session's `s` model: `--model-size s` spent 8-10 s in a subprocess importing torch only to
    # find the bench's cached build (test_bench_smoke builds it through the same path).
    argv = [sys.executable, "-m", "scripts.bench", "--structured", "--model-dir", str(tiny_model_dir)]
    argv += ["--concurrency", "4"]
    argv += ["--max-tokens", "12", "--requests-per-client", "2", "--rounds", "1", "--no-ceiling", "--out", str(out)]
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.with_suffix(".json").read_text())
    plain, mixed = report["rows"]
    assert plain["load"] == "plain" and mixed["load"] == "half json_schema"
    assert not plain["errors"] and not mixed["errors"]
    assert plain["masked_steps"] == 0 and mixed["masked_steps"] > 0 and mixed["mask_ms_per_step"] > 0
    assert plain["completion_tokens"] == mixed["completion_tokens"] == 4 * 2 * 12  # every document runs to max_tokens
    assert report["ratio_median"] > 0
    assert len(report["probes"]) == 3
    for probe in report["probes"]:
        assert probe["calm_gaps"] > 0 and probe["during_gaps"] > 0 and probe["new_schema_compile_ms"] > 0
    text = out.read_text()
    assert "half json_schema / plain tokens/s: median" in text and "| 2 | 4 |" in text
