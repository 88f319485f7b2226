"""Fused projections and the fused decoder: the packed runner on a fused model gives the split
runner's logits on the plain model, step by step, on every architecture it takes; transformers'
own forward is unchanged by fusing; a decoder that differs is refused by the runner's probe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models.kv.cache import SlotCache
from models.linear.int8 import quantize_linears
from models.runner.attention import packed_attention
from models.runner.fused_decoder import FusedDecoder, fuse_projections, is_fused
from models.runner.model_runner import ModelRunner
from tests.models.runner.test_model_runner import load, script

FUSABLE = ("llama", "qwen2", "mistral")  # model types; of the test architectures only gpt2 is not


def model_type(model_dir: Path) -> str:
    return str(json.loads((model_dir / "config.json").read_text())["model_type"])


@pytest.mark.parametrize("capacity", [256, 8])
def test_fused_packed_steps_give_the_split_steps_logits(arch_dir: Path, device: str, capacity: int) -> None:
    model = load(arch_dir, device)
    assert fuse_projections(model) == (model_type(arch_dir) in FUSABLE)
    packed = ModelRunner(model, max_num_seqs=5, max_model_len=64)
    split = ModelRunner(load(arch_dir, device), max_num_seqs=5, max_model_len=64, packed=False)
    assert (packed.decoder is not None) == (model_type(arch_dir) in FUSABLE)
    for runner in (packed, split):
        # 8 positions to start with: the cache grows (and its scratch column moves) mid-script
        runner.cache = SlotCache(len(runner.cache.layers), 5, 64, initial_capacity=capacity)
    for step, (g, w) in enumerate(zip(script(packed), script(split), strict=True)):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=f"step {step}")


def test_transformers_forward_is_unchanged_by_fusing_and_holds_nothing_after(arch_dir: Path, device: str) -> None:
    if model_type(arch_dir) not in FUSABLE:
        pytest.skip("not a fused architecture")
    plain, fused = load(arch_dir, device), load(arch_dir, device)
    assert fuse_projections(fused) and is_fused(fused) and not is_fused(plain)
    assert not fuse_projections(fused)  # already fused: its projections are no longer plain linears
    ids = torch.randint(3, 500, (2, 11), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.inference_mode():
        torch.testing.assert_close(fused(ids).logits, plain(ids).logits, atol=1e-5, rtol=1e-5)
    shared = fused.model.layers[0].self_attn.q_proj._shared
    assert shared.local.input is None and shared.local.output is None  # every slice read: released
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in plain.parameters())


def test_the_probe_refuses_a_decoder_that_differs(arch_dir: Path, device: str) -> None:
    if model_type(arch_dir) != "llama":
        pytest.skip("one architecture is enough for the probe")
    model = load(arch_dir, device)
    fuse_projections(model)
    runner = ModelRunner(model, max_num_seqs=2, max_model_len=64)
    assert runner.decoder is not None
    wrong = FusedDecoder(model, packed_attention)
    wrong.apply_rotary = lambda q, k, cos, sin: (q, k)  # forgets the positions
    assert runner._checked_decoder(wrong) is None
    assert runner._checked_decoder(FusedDecoder(model, packed_attention)) is not None


def test_int8_codes_of_a_fused_layer_are_its_parts_codes(arch_dir: Path, device: str) -> None:
    """Weights scale per output channel and activations per row: quantizing q, k and v as one
    layer must give the logits of quantizing them apart."""
    if device != "cpu" or model_type(arch_dir) != "llama":
        pytest.skip("int8 runs on the CPU; one architecture is enough")
    plain, fused = load(arch_dir, device), load(arch_dir, device)
    fuse_projections(fused)
    for model in (plain, fused):
        assert quantize_linears(model, rows_hint=8) > 0
    ids = torch.randint(3, 500, (1, 13), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(fused(ids).logits, plain(ids).logits, atol=1e-5, rtol=1e-5)
