"""scripts/cached_turn.py against a real surge on the tiny model: the engine's figures it reads
off /metrics around each turn add up with the client's TTFT, and the second turn comes from the
prefix cache (the benchmark's numbers themselves are not checked: speed stays out of `make test`)."""

from __future__ import annotations

import json
from pathlib import Path

from scripts import cached_turn


def test_a_conversations_turns_split_into_front_end_queue_and_prefill(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cached-turn.md"
    argv = ["--model-dir", str(tiny_model_dir), "--systems", "surge", "--conversations", "1", "--turns", "3"]
    argv += ["--prefix-tokens", "96", "--max-tokens", "4", "--out", str(out)]
    assert cached_turn.main(argv) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(r["system"], r["turn"]) for r in rows] == [("surge", 1), ("surge", 2), ("surge", 3)]
    for row in rows:
        assert 0 <= row["queue"] <= row["engine_ttft"] < row["ttft_s"], row
        assert 0 < row["template_s"] < row["ttft_s"], row
    first, *later = rows
    assert first["prompt_tokens"] >= 96 and not first["cached_tokens"]
    for before, row in zip(rows, later, strict=False):
        # Everything the turn before sent is cached but for its last partial block.
        assert before["prompt_tokens"] - 32 <= row["cached_tokens"] < row["prompt_tokens"], row
    table = out.read_text()
    assert "| surge | 2-3 | " in table and "| surge | 1 | " in table
