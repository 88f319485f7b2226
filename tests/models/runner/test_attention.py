"""models/runner/attention.py's grouped decode attention and a prompt chunk's attention: the same
attention as torch's SDPA with grouped-query heads and an additive mask (transformers' function
for a chunk), exact in float32 and to bfloat16's rounding in it."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from models.runner import attention
from models.runner.attention import chunk_attention, grouped_decode_attention


def inputs(rows: int, heads: int, kv_heads: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(rows * 1000 + heads * 10 + kv_heads)
    query = torch.randn(rows, heads, 1, 64, generator=generator)
    # K/V as the pool holds them: a view of the first `length` positions of longer slots.
    key = torch.randn(rows + 2, kv_heads, length + 7, 64, generator=generator)[:rows, :, :length]
    value = torch.randn(rows + 2, kv_heads, length + 7, 64, generator=generator)[:rows, :, :length]
    allowed = torch.arange(length)[None, :] < torch.randint(1, length + 1, (rows, 1), generator=generator)
    mask = torch.zeros(rows, 1, 1, length).masked_fill_(~allowed[:, None, None], torch.finfo(dtype).min)
    return query.to(dtype), key.to(dtype), value.to(dtype), mask.to(dtype)


def reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=mask.float(), enable_gqa=True
    )
    return out.transpose(1, 2)  # (B, 1, H, D)


@pytest.mark.parametrize(("heads", "kv_heads"), [(14, 2), (8, 4), (4, 4)])
def test_float32_grouped_attention_is_sdpas(heads: int, kv_heads: int) -> None:
    query, key, value, mask = inputs(5, heads, kv_heads, 37, torch.float32)
    got = grouped_decode_attention(query, key, value, mask, None)
    torch.testing.assert_close(got, reference(query, key, value, mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("heads", "kv_heads"), [(14, 2), (4, 4)])
def test_bfloat16_grouped_attention_is_sdpa_to_bfloat16_rounding(heads: int, kv_heads: int) -> None:
    query, key, value, mask = inputs(32, heads, kv_heads, 160, torch.bfloat16)
    got = grouped_decode_attention(query, key, value, mask, 0.125)
    assert got.dtype == torch.bfloat16 and got.shape == (32, 1, heads, 64)
    expected = reference(query, key, value, mask)
    assert (got.float() - expected).abs().max() < 0.03
    # Head i reads K/V head i // G: permuting the K/V heads must change the answer.
    if kv_heads > 1:
        swapped = grouped_decode_attention(query, key.flip(1), value.flip(1), mask, 0.125)
        assert (swapped.float() - expected).abs().max() > 0.1


class Layer(torch.nn.Module):
    """What the attention functions read off a model's attention module."""

    def __init__(self, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.num_key_value_groups = heads // kv_heads
        self.is_causal = True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(14, 2), (4, 4)])
def test_a_continuing_chunk_is_transformers_attention(dtype: torch.dtype, heads: int, kv_heads: int) -> None:
    """A chunk of 24 tokens at positions 40-63 of a slot, under the causal mask at that offset."""
    generator = torch.Generator().manual_seed(heads)
    start, num_tokens, length = 40, 24, 64
    query = torch.randn(1, heads, num_tokens, 64, generator=generator).to(dtype)
    key = torch.randn(3, kv_heads, length + 9, 64, generator=generator).to(dtype)[1:2, :, :length]
    value = torch.randn(3, kv_heads, length + 9, 64, generator=generator).to(dtype)[1:2, :, :length]
    allowed = torch.arange(length)[None, :] <= start + torch.arange(num_tokens)[:, None]
    mask = torch.zeros(num_tokens, length).masked_fill_(~allowed, torch.finfo(dtype).min).to(dtype)[None, None]
    layer = Layer(heads, kv_heads)
    got = chunk_attention(layer, query, key, value, mask, scaling=0.125)
    expected, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=0.125)
    assert got.shape == expected.shape == (1, num_tokens, heads, 64)
    torch.testing.assert_close(got, expected, **({} if dtype == torch.float32 else {"rtol": 0.02, "atol": 0.02}))
    # Without a mask the chunk starts its prompt: causal from its own first key.
    fresh = chunk_attention(layer, query, key[:, :, :num_tokens], value[:, :, :num_tokens], None, scaling=0.125)
    causal, _ = sdpa_attention_forward(
        layer, query, key[:, :, :num_tokens], value[:, :, :num_tokens], None, scaling=0.125
    )
    torch.testing.assert_close(fresh, causal)


def test_the_decode_kernel_is_measured_and_both_ways_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """`choose_decode_kernel` records whichever way is faster on this CPU, and decode attention
    takes it; the two ways give the same attention to bfloat16's rounding."""
    monkeypatch.setattr(attention, "GROUPED_DECODE", {})
    use = attention.choose_decode_kernel(torch.bfloat16, heads=14, kv_heads=2, dim=64, rows=4)
    assert {(torch.bfloat16, 14, 2, 64): use} == attention.GROUPED_DECODE
    query, key, value, mask = inputs(4, 14, 2, 50, torch.bfloat16)
    layer = Layer(14, 2)
    answers = []
    for grouped in (True, False):
        attention.GROUPED_DECODE[(torch.bfloat16, 14, 2, 64)] = grouped
        answers.append(attention.decode_attention(layer, query, key, value, mask, scaling=0.125).float())
    assert answers[0].shape == (4, 1, 14, 64)
    expected = reference(query, key, value, mask)  # float32; the same scale, 64 ** -0.5
    assert all((answer - expected).abs().max() < 0.03 for answer in answers)


def test_each_attention_shape_keeps_its_own_decode_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two models of one dtype with different heads in one process: each shape's decode attention
    runs the way measured for it, not the way measured last."""
    calls: list[int] = []

    def counted(query: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(query.shape[1])
        return grouped_decode_attention(query, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(attention, "grouped_decode_attention", counted)
    monkeypatch.setattr(
        attention, "GROUPED_DECODE", {(torch.bfloat16, 14, 2, 64): True, (torch.bfloat16, 8, 4, 64): False}
    )
    for heads, kv_heads in ((14, 2), (8, 4)):
        query, key, value, mask = inputs(3, heads, kv_heads, 20, torch.bfloat16)
        out = attention.decode_attention(Layer(heads, kv_heads), query, key, value, mask, scaling=0.125)
        assert out.shape == (3, 1, heads, 64)
    assert calls == [14]
