"""scripts/perplexity.py on surge's side (llama.cpp's needs its build, outside `make test`): the
float32, bfloat16 and int8 models scored on the same chunks, the int8 one close but not identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import perplexity


def test_surge_scores_float32_bfloat16_and_int8_on_the_same_chunks(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "scores.json"
    argv = ["--model-dir", str(tiny_model_dir), "--cache-dir", str(tmp_path), "--no-llama"]
    weights = ["--surge-weights", "bfloat16,int8"]  # float32 comes first by itself: the base
    assert perplexity.main([*argv, *weights, "--ctx", "32", "--chunks", "3", "--out", str(out)]) == 0
    scores = {row["weights"]: row for row in json.loads(out.read_text())}
    float32, bf16, int8 = scores["float32"], scores["bfloat16"], scores["int8"]
    assert 0 < bf16["kld"] < 0.05 and bf16["ppl"] != float32["ppl"] and abs(bf16["ppl"] / float32["ppl"] - 1) < 0.05
    assert bf16["weight_bytes"] < float32["weight_bytes"]
    assert float32["kld"] is None and 0 < int8["kld"] < 0.05
    assert 0.5 < int8["same_top"] <= 1.0
    assert int8["ppl"] != float32["ppl"] and abs(int8["ppl"] / float32["ppl"] - 1) < 0.05
    assert int8["weight_bytes"] < float32["weight_bytes"]
    table = capsys.readouterr().out
    assert "3 chunks of 32 tokens (45 scored)" in table and "| surge | int8 |" in table


def test_chunks_score_the_second_half_of_each(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    log_probs, targets = perplexity.chunk_log_probs(model, list(range(3, 3 + 64)), ctx=16, chunks=4)
    assert log_probs.shape[0] == targets.shape[0] == 4 * 7  # positions 8..14 predict 9..15
    assert targets[:7].tolist() == list(range(3 + 9, 3 + 16))
