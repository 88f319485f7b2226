"""scripts/bench_long.py's pieces that need no server: prompts of an exact token count, the
interference window's gaps, the report (the benchmark itself runs outside `make test`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from scripts import bench_long


def test_prompts_reach_the_token_count_within_a_word_and_differ(tiny_model_dir: Path) -> None:
    prompts = bench_long.Prompts(tiny_model_dir)
    texts = [prompts.text(300) for _ in range(3)]
    assert len(set(texts)) == 3
    for text in texts:
        count = prompts.count(text)
        assert 300 <= count < 300 + 8  # the fewest words that reach it: one word's tokens past at most
        assert prompts.count(text.rsplit(" ", 1)[0]) < 300


def test_gaps_split_at_the_long_prompts_arrival_and_first_token() -> None:
    streams = [[0.0, 1.0, 2.0, 5.0, 6.0], [0.5, 1.5, 4.5, 7.0]]
    before, during = bench_long.split_gaps(streams, arrival=2.5, first=4.0)
    assert sorted(before) == [1.0, 1.0, 1.0]  # gaps that ended by the arrival
    assert sorted(during) == [3.0, 3.0]  # 2.0 -> 5.0 and 1.5 -> 4.5 span the window
    # 5.0 -> 6.0 and 4.5 -> 7.0 start after the first token: neither


def test_the_report_compares_with_llama_server_in_the_same_round(tiny_model_dir: Path) -> None:
    args = argparse.Namespace(dtype="float32", quantization="none", interference_length=8192)
    base = {"workload": "prefill", "length": 2048, "streams": 1, "round": 1, "errors": 0, "cached_share": 0.0}
    rows = [
        base | {"system": "surge", "ttft_p50_s": 0.4, "ttft_max_s": 0.4, "prefill_tokens_per_s": 5000.0},
        base | {"system": "llama-server", "ttft_p50_s": 0.5, "ttft_max_s": 0.5, "prefill_tokens_per_s": 4000.0},
        {"workload": "interference", "length": 8192, "streams": 8, "round": 1, "system": "surge", "errors": 0}
        | {"long_ttft_s": 3.0, "itl_before_p50_s": 0.015, "itl_during_p50_s": 0.03, "itl_during_p99_s": 0.12}
        | {"itl_during_max_s": 0.2, "gaps_during": 40},
    ]
    peaks = {"float32": 1e11, "bfloat16": 1e9, "int8": 1e11, "int8_kernel": "x", "memory_bytes_per_s": 2e10}
    peaks |= {"memory_read_bytes_per_s": 2e10, "memory_copy_bytes_per_s": 1.9e10}
    text = bench_long.render(rows, args, tiny_model_dir, peaks, "cmd")
    assert "| prefill | 2,048 | 1 | 1 | surge | 0.40 | 0.40 | 5,000 | 1.25x | 0% |" in text
    assert "| 1 | surge | 3.00 | 15 | 30 | 120 | 200 | 40 |" in text
