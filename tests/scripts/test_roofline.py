"""The roofline's arithmetic: a model's costs from its config, a phase's fraction of the peaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.benchkit import roofline


def test_costs_count_every_linear_weight_and_the_head(tmp_path: Path) -> None:
    config = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    config |= {"intermediate_size": 128, "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    costs = roofline.model_costs(tmp_path)
    # per layer: q and o 64x64 each, k and v 64x32 each, gate/up/down 3 x 64x128; plus the 1000x64 head
    assert costs.linear_params == 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 1000 * 64
    assert costs.head_dim == 16 and costs.kv_heads == 2
    assert costs.flops_per_token(0) == 2 * costs.linear_params
    assert costs.flops_per_token(10) == 2 * costs.linear_params + 4 * 2 * 4 * 16 * 10
    assert costs.kv_bytes_per_token(4) == 2 * 2 * 2 * 16 * 4


def test_decode_reads_the_weights_each_step_and_prefill_is_bound_by_flops(tmp_path: Path) -> None:
    costs = roofline.ModelCosts(linear_params=1_000_000, layers=2, heads=4, kv_heads=2, head_dim=16)
    peaks = {"float32": 1e11, "bfloat16": 2e11, "int8": 3e11, "memory_bytes_per_s": 1e10}
    decode = roofline.phase_roofline(costs, peaks, "float32", tokens_per_s=320, context=0, steps_per_s=10)
    assert decode["bytes_per_s"] == 10 * 1_000_000 * 4 and decode["bytes_of_peak"] == pytest.approx(0.004)
    assert decode["flops_of_peak"] == pytest.approx(320 * 2e6 / 1e11)
    int8 = roofline.phase_roofline(costs, peaks, "int8", tokens_per_s=320, context=0, steps_per_s=10)
    assert int8["bytes_per_s"] == 10 * 1_000_000 * 1.125 and int8["flops_of_peak"] == pytest.approx(320 * 2e6 / 3e11)
    prefill = roofline.phase_roofline(costs, peaks, "bfloat16", tokens_per_s=1000, context=100)
    assert prefill["flops_per_s"] == 1000 * costs.flops_per_token(100)
    assert prefill["bytes_per_s"] == 1000 * 100 * costs.kv_bytes_per_token(2)  # no weight reads counted
