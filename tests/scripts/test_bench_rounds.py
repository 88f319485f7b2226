"""`scripts/bench.py --rounds`: rounds combined into one row per system (medians, pooled latencies)
and the per-round ratios the targets are stated in; pure functions, no server."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def measured(bench: ModuleType, system: str, round_: int, ttfts: list[float], wall_s: float, ceiling: float) -> Any:
    results = [bench.RequestResult(ttft_s=t, e2e_s=t + 1.0, itl_s=[0.01], completion_tokens=64) for t in ttfts]
    row = {"system": system, "concurrency": 2, "load": "closed", "round": round_}
    row |= bench.summarize(results, wall_s) | {"errors": [], "peak_rss_mib": 100.0 + round_}
    row["vs_ceiling"] = row["tokens_per_s"] / ceiling
    return row, results


def test_rounds_combine_into_medians_and_pooled_latencies(bench: ModuleType) -> None:
    ceilings = [1000.0, 500.0, 800.0]
    rows: list[dict[str, Any]] = []
    results: list[list[Any]] = []
    for round_, (wall, ttft) in enumerate([(1.0, 0.1), (2.0, 0.3), (4.0, 0.2)]):
        rows.append({"system": "ceiling", "concurrency": 2, "load": "batch", "round": round_})
        rows[-1]["tokens_per_s"] = ceilings[round_]
        results.append([])
        row, res = measured(bench, "surge", round_, [ttft, ttft], wall, ceilings[round_])
        rows.append(row)
        results.append(res)
    combined = bench.combine_rounds(rows, results)
    ceiling, surge = combined
    assert ceiling["tokens_per_s"] == 800.0 and ceiling["rounds"] == 3
    # 128 tokens in 1, 2 and 4 s: 128, 64 and 32 tok/s; the median of the rounds, not of pooled time
    assert surge["tokens_per_s"] == 64.0
    # ratios taken within each round (0.128, 0.128, 0.04), then the median
    assert surge["vs_ceiling"] == pytest.approx(0.128)
    assert surge["num_requests"] == 6 and surge["ttft_p50_s"] == pytest.approx(0.2)
    assert surge["peak_rss_mib"] == 102.0 and "round" not in surge


def test_round_ratios_compare_surge_with_the_ceiling_and_the_peer_in_the_same_round(bench: ModuleType) -> None:
    from scripts.benchkit.report import round_ratios

    rows = [
        {"system": "ceiling", "concurrency": 32, "load": "batch", "round": 0, "tokens_per_s": 1000.0},
        {"system": "surge", "concurrency": 32, "load": "closed", "round": 0, "tokens_per_s": 800.0, "ttft_p99_s": 0.3},
        {"system": "transformers", "concurrency": 32, "load": "closed", "round": 0, "tokens_per_s": 400.0}
        | {"ttft_p99_s": 0.6},
        {"system": "surge", "concurrency": 32, "load": "closed", "round": 1, "tokens_per_s": 900.0},
    ]
    first, second = round_ratios(rows)
    assert (first["round"], first["surge_vs_ceiling"], first["surge_vs_peer"]) == (1, 0.8, 2.0)
    assert first["ttft_p99_vs_peer"] == 0.5
    assert second["round"] == 2 and "surge_vs_peer" not in second and second["ceiling"] is None


def test_issue_19_targets_compare_surge_with_each_peer_at_the_same_concurrency() -> None:
    from scripts.benchkit.report import render, serving_targets

    rows = [
        {"system": "ceiling", "concurrency": 32, "load": "batch", "tokens_per_s": 1000.0},
        {"system": "surge", "concurrency": 32, "load": "closed", "tokens_per_s": 900.0, "ttft_p99_s": 0.5}
        | {"vs_ceiling": 0.8},
        {"system": "llama-server", "concurrency": 32, "load": "closed", "tokens_per_s": 800.0, "ttft_p99_s": 0.4},
        {"system": "transformers", "concurrency": 32, "load": "closed", "tokens_per_s": 300.0, "ttft_p99_s": 2.0},
        {"system": "surge", "concurrency": 8, "load": "closed", "tokens_per_s": 400.0, "ttft_p99_s": 0.1},
        {"system": "surge", "stack": "off", "concurrency": 32, "load": "closed", "tokens_per_s": 1.0},
    ]
    lines = {(t["metric"], t["versus"]): t for t in serving_targets(rows)}
    assert set(lines) == {("tokens/s", "llama-server"), ("TTFT p99", "llama-server"), ("tokens/s", "ceiling")} | {
        ("tokens/s", "transformers")
    }  # concurrency 8 has no peer: nothing to judge there
    assert (
        lines["tokens/s", "llama-server"]["ratio"] == pytest.approx(1.125) and lines["tokens/s", "llama-server"]["met"]
    )
    assert lines["TTFT p99", "llama-server"]["ratio"] == 1.25 and not lines["TTFT p99", "llama-server"]["met"]
    assert lines["tokens/s", "ceiling"]["ratio"] == 0.8 and not lines["tokens/s", "ceiling"]["met"]  # within rounds
    assert lines["tokens/s", "transformers"]["met"]
    machine = {"nproc": 2, "cpu": "cpu", "torch": "t", "python": "p", "loadavg": (0.0, 0.0, 0.0)}
    text = render(rows, machine, "cmd", "note")
    assert "| 32 | TTFT p99 | 500.0 | llama-server | 400.0 | 1.25x | <= 1.00x | not met |" in text
    assert "| 32 | tokens/s | 900.0 | llama-server | 800.0 | 1.12x | >= 1.10x | met |" in text


def test_the_ceiling_tries_every_thread_count_up_to_the_cpus() -> None:
    from scripts.benchkit.ceiling import thread_counts

    assert thread_counts(2) == [1, 2] and thread_counts(1) == [1] and thread_counts(0) == [1]


def test_llama_server_runs_on_every_cpu_unless_told(bench: ModuleType, tmp_path: Path) -> None:
    from models.runner.cpus import available_cpus

    binary, gguf = tmp_path / "llama-server", tmp_path / "m.gguf"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    gguf.write_text("")
    args = bench.parse_args(["--llama-server", str(binary), "--gguf", str(gguf), "--out", str(tmp_path / "b.md")])
    argv = bench.llama_server(32, args).argv
    assert argv[argv.index("-t") + 1] == argv[argv.index("-tb") + 1] == str(available_cpus())
    args = bench.parse_args(["--llama-threads", "1", "--llama-server", str(binary), "--gguf", str(gguf)])
    argv = bench.llama_server(32, args).argv
    assert argv[argv.index("-t") + 1] == "1"
