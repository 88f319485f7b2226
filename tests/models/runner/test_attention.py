"""models/runner/attention.py's grouped decode attention: the same attention as torch's SDPA with
grouped-query heads and an additive mask, exact in float32 and to bfloat16's rounding in it."""

from __future__ import annotations

import pytest
import torch

from models.runner.attention import grouped_decode_attention


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
