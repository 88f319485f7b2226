"""8-bit linear layers (`--quantization int8`): oneDNN's per-channel kernel (exact integer sums,
per-row activation scales), the choice between it and surge's block kernel, a quantized model
that still answers, and a clear refusal off the CPU."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import openai
import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from models.config import ModelConfig
from models.linear import block_kernel, int8
from models.linear.block_int8 import BlockInt8Linear
from models.linear.int8 import WEIGHT_QMAX, Int8Linear, activation_qmax, quantize_linears
from tests.live_server import MODEL_NAME, running_server


def _reference(layer: Int8Linear, linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """What the layer must compute, in float64 from the same integer codes: per-row activation
    scales and per-channel weight scales times an exact integer sum."""
    w = linear.weight.double()
    w_scale = w.abs().amax(dim=1) / WEIGHT_QMAX
    w_codes = torch.round(w / w_scale[:, None]).clamp(-WEIGHT_QMAX, WEIGHT_QMAX)
    rows = x.reshape(-1, linear.in_features).double()
    x_scale = rows.abs().amax(dim=1, keepdim=True) / layer.qmax
    x_codes = torch.round(rows / x_scale)
    out = (x_codes @ w_codes.T) * w_scale * x_scale
    if linear.bias is not None:
        out = out + linear.bias.double()
    return out.reshape(*x.shape[:-1], linear.out_features)


@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_sums_the_codes_exactly_at_the_probed_activation_range(bias: bool) -> None:
    # Activations at the extremes of their range against weights at theirs: where the kernel's
    # u8 x s8 instruction saturates (x86 without VNNI), 8-bit activations would be clipped here.
    torch.manual_seed(0)
    linear = nn.Linear(256, 96, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.sign(torch.randn(96, 256)) * 0.05)
    layer = Int8Linear(linear, activation_qmax(), rows_hint=8)
    x = torch.sign(torch.randn(2, 4, 256)) * torch.tensor([1.0, 7.0, 0.01, 300.0])[None, :, None]
    got = layer(x)
    assert got.shape == (2, 4, 96) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _reference(layer, linear, x), rtol=1e-5, atol=1e-6)


def test_each_row_keeps_its_own_scale() -> None:
    # A row a million times smaller than its neighbour keeps its precision: one scale for the
    # batch would round it to zero.
    torch.manual_seed(1)
    linear = nn.Linear(128, 64)
    x = torch.randn(2, 128)
    x[1] *= 1e-6
    got, want = Int8Linear(linear, activation_qmax(), rows_hint=2)(x), linear(x).detach()
    assert ((got - want).norm(dim=1) / want.norm(dim=1)).max() < 0.03


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_channel_codes_are_the_whole_layers_however_it_is_chunked(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few channels at a time (bounded temporaries), the codes and scales of the whole weight."""
    torch.manual_seed(0)
    weight = (torch.randn(37, 24) * torch.logspace(-3, 2, 37)[:, None]).to(dtype)
    wide = weight.float()
    scale = wide.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / WEIGHT_QMAX
    expected = torch.round(wide / scale[:, None]).clamp_(-WEIGHT_QMAX, WEIGHT_QMAX).to(torch.int8)
    monkeypatch.setattr("models.linear.int8.CHUNK_ELEMENTS", 24 * 5)  # 5 channels a chunk: 8 chunks
    codes, scales = int8.quantize_per_channel(weight)
    assert codes.dtype == torch.int8 and torch.equal(codes, expected) and torch.equal(scales, scale)


def test_the_probe_answers_what_the_kernel_does() -> None:
    assert activation_qmax() in (63, 127)


def test_a_bfloat16_input_comes_back_bfloat16() -> None:
    linear = nn.Linear(64, 32)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    got = Int8Linear(linear, activation_qmax(), rows_hint=3)(x)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - linear(x.float())).norm() / linear(x.float()).norm()) < 0.05


def _expected_layer() -> type[nn.Module]:
    """What `quantize_linears` must pick here: blocks of 32 where surge's kernel runs."""
    try:
        block_kernel.load()
    except block_kernel.KernelUnavailable:
        return Int8Linear
    return BlockInt8Linear


def _bytes(layer: nn.Module) -> int:
    if isinstance(layer, Int8Linear):
        return layer.weight_scale.numel() * 4 + layer.packed.numel()
    assert isinstance(layer, BlockInt8Linear)
    return layer.scales.numel() * 4 + layer.codes.numel()


@torch.inference_mode()
def test_a_quantized_model_stays_close_to_float32_and_holds_under_a_third_of_the_bytes(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    quantized = copy.deepcopy(model)
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    assert quantize_linears(quantized, rows_hint=4) == len({id(m) for m in linears}) > 0
    assert not any(type(m) is nn.Linear for m in quantized.modules())
    ids = torch.randint(3, 2000, (2, 48), generator=torch.Generator().manual_seed(0))
    want, got = model(ids).logits.log_softmax(-1), quantized(ids).logits.log_softmax(-1)
    kl = (want.exp() * (want - got)).sum(-1).mean()
    assert kl < 0.01, kl
    assert (want.argmax(-1) == got.argmax(-1)).float().mean() > 0.8
    float_bytes = sum(m.weight.numel() * 4 for m in {id(m): m for m in linears}.values())
    layers = [m for m in quantized.modules() if type(m) is _expected_layer()]
    assert len(layers) == len({id(m) for m in linears})
    assert sum(_bytes(m) for m in layers) < 0.3 * float_bytes


def test_without_the_block_kernel_int8_falls_back_to_onednn_and_says_why(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unavailable() -> block_kernel.BlockKernel:
        raise block_kernel.KernelUnavailable("no C compiler ('cc' not found) to build surge's int8 block kernel")

    monkeypatch.setattr(block_kernel, "load", unavailable)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with caplog.at_level(logging.WARNING, logger="surge.engine"):
        count = quantize_linears(model, rows_hint=4)
    assert count > 0 and all(type(m) is not nn.Linear for m in model.modules())
    assert any(type(m) is Int8Linear for m in model.modules())
    assert "per output channel through oneDNN" in caplog.text and "no C compiler" in caplog.text


def test_int8_off_the_cpu_is_refused_before_loading() -> None:
    with pytest.raises(ValueError, match="CPU only"):
        ModelConfig("tiny", device="cuda", quantization="int8")
    with pytest.raises(ValueError, match="unknown quantization"):
        ModelConfig("tiny", quantization="int4")


def test_an_int8_server_answers_the_openai_sdk(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, quantization="int8", max_num_seqs=4) as live:
        assert live.engine.core.runner.model is not None
        assert any(type(m) is _expected_layer() for m in live.engine.core.runner.model.modules())
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="k", max_retries=0)
        reply = client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        assert reply.choices[0].finish_reason in ("length", "stop")
