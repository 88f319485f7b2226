"""Attention for a packed step: the function transformers calls in every layer, registered with
its AttentionInterface, and the decode block's kernel choice on the CPU.

models/runner/model_runner.py says what a packed step is; it sets `ACTIVE.plan` around each one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from models.kv.cache import StepPlan

log = logging.getLogger("surge.engine")

# The packed step being run on this thread: the attention function reads its layout here
# (transformers passes attention functions no cache). Per thread, so runners on different
# threads, or sharing one model object, never see each other's step.
ACTIVE = threading.local()
PACKED_ATTENTION = "surge_packed_sdpa"
# Decode attention in these dtypes may run as grouped matmuls instead of torch's CPU SDPA kernel.
HALF_DTYPES = (torch.bfloat16, torch.float16)
# Measured at load by `choose_decode_kernel`, per (dtype, query heads, K/V heads, head size): whether
# decode attention of that shape runs as grouped matmuls (True) or torch's kernel (False); a shape
# not measured runs grouped. Keyed by shape, so two models in one process keep their own choice.
DecodeShape = tuple[torch.dtype, int, int, int]
GROUPED_DECODE: dict[DecodeShape, bool] = {}


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for a packed step: query (1, H, N, D); key/value every slot's (S, KVH, L, D).

    The mask is the packed one, (1, 1, N, L): row i against its own slot's positions. The
    decode block runs as a batch of one-token queries against slots [0, num_rows); each chunk
    as one sequence against its slot. Outside a packed step (a model shared with other code)
    this is plain SDPA.
    """
    plan: StepPlan | None = getattr(ACTIVE, "plan", None)
    if plan is None or plan.chunks is None or attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    parts = []
    num_rows = plan.num_rows
    if num_rows:
        length = plan.decode_len
        q = query[0, :, :num_rows].transpose(0, 1)[:, :, None]  # (B, H, 1, D)
        decode_mask = attention_mask[0, 0, :num_rows, None, None, :length]  # (B, 1, 1, L)
        k, v = key[:num_rows, :, :length], value[:num_rows, :, :length]
        out = decode_attention(module, q, k, v, decode_mask, **kwargs)
        parts.append(out.transpose(0, 1))  # (B, 1, H, D) -> (1, B, H, D)
    if plan.chunk_index is not None and plan.chunk_slots is not None and plan.chunk_real is not None:
        # Several chunks: one padded (C, T) batch against a copy of their slots' K/V. One SDPA
        # call instead of one per chunk (a burst of arrivals brings dozens of chunks).
        index, length = plan.chunk_index, plan.chunk_len
        q = query[0][:, index].transpose(0, 1)  # (H, C, T, D) -> (C, H, T, D)
        # Causal: a chunk's real rows see only its own keys; its padding rows (discarded) may see more.
        mask = None if plan.causal_chunks else attention_mask[0, 0, :, :length][index][:, None]  # (C, 1, T, L)
        slots = plan.chunk_slots
        k, v = key[slots, :, :length], value[slots, :, :length]
        out, _ = sdpa_attention_forward(module, q, k, v, mask, **kwargs)  # (C, T, H, D)
        parts.append(out.flatten(0, 1).index_select(0, plan.chunk_real)[None])  # (1, P, H, D)
    else:
        for chunk in plan.chunks:  # each chunk alone: its slot's K/V as a view, no copy
            rows = slice(chunk.start, chunk.start + chunk.num_tokens)
            # A fresh chunk's keys are its own tokens: causal, no mask (SDPA skips the upper half).
            causal = plan.causal_chunks or chunk.fresh
            kv, length = slice(chunk.slot, chunk.slot + 1), chunk.num_tokens if chunk.fresh else plan.chunk_len
            k, v = key[kv, :, :length], value[kv, :, :length]
            mask = None if causal else attention_mask[:, :, rows, :length]
            parts.append(chunk_attention(module, query[:, :, rows], k, v, mask, **kwargs))  # (1, T, H, D)
    return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)), None


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    **kwargs: Any,
) -> torch.Tensor:
    """The decode block's attention: one-token queries (B, H, 1, D), each row against its own
    slot's keys (B, KVH, L, D) under its mask; returns (B, 1, H, D).

    On the CPU, bfloat16 and float16 run as grouped matmuls (`grouped_decode_attention`) where
    they measured faster at load (`choose_decode_kernel`), and float32 grouped-query attention
    goes to torch's kernel as it is (`enable_gqa`), as do the half dtypes elsewhere.
    transformers' SDPA function takes that path only without a mask (CUDA's kernels need none for
    it); with one it packs each group's query heads as positions of one query, which torch's CPU
    kernel splits badly over threads. Measured on 2 AVX2 cores, 2 threads, 32 decoding rows: one
    layer of the tiny m 410 us packed against 144 us here; the whole decode step of m 19.0 -> 16.5
    and 21.1 -> 17.9 ms in two runs, of l 513 -> 474 ms (medians of interleaved runs; the VM was
    slow then); on 1 thread no change. Anything else (CUDA, no groups, dropout, softcap, position
    bias, sinks) goes through transformers' function.
    """
    plain = _is_plain_cpu(query, kwargs)
    if plain and query.dtype in HALF_DTYPES and GROUPED_DECODE.get(_decode_shape(query, key), True):
        return grouped_decode_attention(query, key, value, mask, kwargs.get("scaling"))
    if not plain or getattr(module, "num_key_value_groups", 1) == 1:
        out, _ = sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        return out
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=kwargs.get("scaling"), enable_gqa=True
    )  # (B, H, 1, D)
    return out.transpose(1, 2)


def choose_decode_kernel(dtype: torch.dtype, heads: int, kv_heads: int, dim: int, rows: int = 32) -> bool:
    """Time a `rows`-row decode block's attention over 1,024 positions both ways in `dtype` on
    this CPU, with the model's heads, and run decode attention the faster way from now on
    (GROUPED_DECODE); returns whether that is the grouped matmuls.

    Which wins depends on the CPU, and by far: torch's CPU SDPA kernel ran bfloat16 6-9x slower
    than the grouped matmuls on a Zen 4 (AVX512_BF16, no AMX), and 1.4-2.3x faster than them on
    an Intel Xeon with AMX (2 threads, 14/2 heads: 4.9 against 7.2 ms a layer at 32 rows x 2,048
    positions, 27 against 64 at 8,192, both reading the cache's slots)."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(rows, heads, 1, dim, generator=generator).to(dtype)
    # Views of longer slots, as the cache holds them: on contiguous keys the grouped matmuls ran
    # 1.5x faster than on these views, and won on the AMX VM where the views lost.
    key = torch.randn(rows, kv_heads, 4096, dim, generator=generator).to(dtype)[:, :, :1024]
    value = torch.randn(rows, kv_heads, 4096, dim, generator=generator).to(dtype)[:, :, :1024]
    mask = torch.zeros(rows, 1, 1, 1024, dtype=dtype)
    grouped, sdpa = _fastest(
        lambda: grouped_decode_attention(query, key, value, mask, None),
        lambda: torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True),
    )
    GROUPED_DECODE[(dtype, heads, kv_heads, dim)] = use = grouped < sdpa
    way = "grouped matmuls" if use else "torch's SDPA kernel"
    log.info(
        "%s decode attention: %s (%d rows x 1,024 positions: grouped %.2f ms, SDPA %.2f ms)",
        str(dtype).removeprefix("torch."),
        way,
        rows,
        grouped * 1e3,
        sdpa * 1e3,
    )
    return use


def _decode_shape(query: torch.Tensor, key: torch.Tensor) -> DecodeShape:
    """GROUPED_DECODE's key for a decode block's query (B, H, 1, D) and keys (B, KVH, L, D)."""
    return query.dtype, query.shape[1], key.shape[1], query.shape[-1]


def _fastest(*calls: Callable[[], object], repeats: int = 3) -> list[float]:
    """Each call's fastest of `repeats` timings, after an untimed call (its kernels are built
    there); the calls take turns, so a neighbour's burst on the CPU slows them alike."""
    best = [float("inf")] * len(calls)
    for turn in range(repeats + 1):
        for i, call in enumerate(calls):
            started = time.perf_counter()
            call()
            if turn:
                best[i] = min(best[i], time.perf_counter() - started)
    return best


def chunk_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    **kwargs: Any,
) -> torch.Tensor:
    """One prompt chunk's attention: queries (1, H, T, D) against its slot's keys (1, KVH, L, D),
    under `mask` (None: causal from the chunk's own first token); returns (1, T, H, D).

    A chunk that continues a prompt needs a mask (its queries sit at the end of the keys, where
    SDPA's `is_causal` would put them at the start), and with a mask transformers' function
    copies the keys and values once per query head of their group (`repeat_kv`): on the CPU that
    copy grows with the context, not the chunk, and for a long prompt's later chunks it cost more
    than their matmuls. torch's CPU kernel reads the groups itself (`enable_gqa`), as in decode.
    """
    if mask is None or getattr(module, "num_key_value_groups", 1) == 1 or not _is_plain_cpu(query, kwargs):
        out, _ = sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        return out
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=kwargs.get("scaling"), enable_gqa=True
    )  # (1, H, T, D)
    return out.transpose(1, 2)


def _is_plain_cpu(query: torch.Tensor, kwargs: dict[str, Any]) -> bool:
    """Attention torch's own CPU kernel can run as it is: no dropout, softcap, bias or sinks."""
    return (
        query.device.type == "cpu"
        and not kwargs.get("dropout")
        and all(kwargs.get(name) is None for name in ("softcap", "position_bias", "s_aux"))
    )


def grouped_decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """Decode attention as two batched matmuls: (B, H, 1, D) queries against (B, KVH, L, D) keys
    under an additive (B, 1, 1, L) mask; returns (B, 1, H, D).

    Each K/V head's group of query heads (head i reads K/V head i // G, as transformers'
    `repeat_kv`) is one (G, D) x (D, L) product, so the keys are read once per group, in the
    model's dtype, by oneDNN's bf16 matmul; the scores' softmax runs in float32, and the
    probabilities go back to the model's dtype for the product with the values. torch's CPU SDPA
    kernel took 6-9x as long on bfloat16 as this (Zen 4, 2 threads, 32 rows of Qwen2.5-0.5B's 14
    heads over 2 K/V heads: 4.7 ms against 0.53 ms a layer at 160 positions, 63 against 9.5 at
    2,048; 7x its own float32 time); the error against float32 attention 0.002-0.009, about a
    bfloat16 rounding of the output.
    """
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float()  # (B, KVH, G, L)
    scores.mul_(dim**-0.5 if scale is None else scale).add_(mask)
    probs = scores.softmax(dim=-1).to(query.dtype)
    return torch.matmul(probs, value).reshape(rows, 1, heads, dim)


def supports_packed(model: PreTrainedModel) -> bool:
    """Whether the model's attention goes through AttentionInterface, and as SDPA (no softcap etc.)."""
    if not getattr(model, "_supports_attention_backend", False):
        return False
    config = model.config
    if getattr(config, "_attn_implementation", None) not in ("sdpa", PACKED_ATTENTION):
        return False
    # Logit or attention softcapping (Gemma 2) has no SDPA form; such a model runs split (eager).
    text = config.get_text_config()
    return getattr(text, "attn_logit_softcapping", None) is None
