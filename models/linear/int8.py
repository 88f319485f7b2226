"""8-bit linear layers on the CPU (`--quantization int8`): int8 weights, activations quantized per
row at each call, the products summed in int32 by oneDNN.

Weights: symmetric int8 per output channel (scale = the row's largest magnitude / 127), packed
once for oneDNN; the float32 weight is not kept, so each layer holds a quarter of its bytes.
Activations: symmetric per row (per token), scale = the row's largest magnitude / `qmax`, shifted
by a zero point into uint8, the layout x86's int8 dot-product instructions take (u8 x s8). The
kernel is told one scale for all rows (1.0) and the output is multiplied by each row's own scale
afterwards, so a token with small activations keeps its precision beside one with large ones.
Row counts are rounded up as for the float32 kernels (models/runner/row_buckets.py).

`qmax` is 127 where the kernel sums exactly. On x86 without VNNI (AVX2, AVX-512 before Cascade
Lake) the u8 x s8 instruction adds pairs of products into int16 and saturates: with activations up
to 255 a pair reaches 2 x 255 x 127 and is clipped (a 1.7% relative error on a layer of the tiny
`l`, measured). There activations take 7 bits (|q| <= 63 around a zero point of 64, so a pair stays
under 2 x 127 x 127 < 2^15), as fbgemm's `reduce_range` does. Which case holds is found by a probe
at load: the worst case for saturation, summed by the kernel and exactly.

NOTE: `torch.ops.onednn.qlinear_prepack` and `qlinear_pointwise` are the ops torch's compiler
(inductor, x86 int8) emits for quantized linears; torch is pinned. Where they are missing or fail
on this CPU, loading stops with an error naming the cause: a server asked for int8 does not serve
float32 behind the operator's back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from models.linear import amx, block_kernel
from models.linear.block_int8 import CHUNK_ELEMENTS, TILE_ROWS, BlockInt8Linear
from models.linear.swap import cpu_linears, swap_linears
from models.runner.row_buckets import pad_rows

log = logging.getLogger("surge.engine")

WEIGHT_QMAX = 127


class Int8Linear(nn.Module):
    """`nn.Linear`'s forward on int8 weights (per output channel) and int8 activations (per row)."""

    def __init__(self, linear: nn.Linear, qmax: int, rows_hint: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        qweight, scale = quantize_per_channel(linear.weight.detach())
        self.packed = torch.ops.onednn.qlinear_prepack(qweight, [rows_hint, self.in_features])
        self.weight_scale = scale
        self.weight_zero = torch.zeros(self.out_features, dtype=torch.int64)
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        self.qmax, self.zero = qmax, qmax + 1  # uint8 codes 1..2*qmax+1 around the zero point

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()  # a no-op on float32; bfloat16 models pass through
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30).div_(self.qmax)
        codes = pad_rows(torch.round(rows / scale).add_(self.zero).to(torch.uint8), fill=self.zero)
        out = torch.ops.onednn.qlinear_pointwise(
            codes, 1.0, self.zero, self.packed, self.weight_scale, self.weight_zero,
            None, 1.0, 0, torch.float32, "none", [], "",
        )[: rows.shape[0]]  # fmt: skip
        out.mul_(scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 (activations {self.qmax})"


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, float32 scale per output channel) of a float weight (out x in), a few channels
    at a time: whole, a 151,936-row output layer's float32 temporaries were 0.5 GB each."""
    codes = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty(weight.shape[0])
    step = max(1, CHUNK_ELEMENTS // max(1, weight.shape[1]))
    for start in range(0, weight.shape[0], step):
        rows = weight[start : start + step].float()
        scale = rows.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / WEIGHT_QMAX
        codes[start : start + step] = torch.round(rows / scale[:, None]).clamp_(-WEIGHT_QMAX, WEIGHT_QMAX)
        scales[start : start + step] = scale
    return codes, scales


def activation_qmax() -> int:
    """127 where oneDNN's int8 kernel sums u8 x s8 products exactly on this CPU, 63 where it
    saturates (no VNNI): the probe sums the worst case, 255 x 127 in every position."""
    rows, features = 4, 64
    codes = torch.full((rows, features), 255, dtype=torch.uint8)
    weight = torch.full((8, features), 127, dtype=torch.int8)
    packed = torch.ops.onednn.qlinear_prepack(weight, [rows, features])
    out = torch.ops.onednn.qlinear_pointwise(
        codes, 1.0, 0, packed, torch.ones(8), torch.zeros(8, dtype=torch.int64),
        None, 1.0, 0, torch.float32, "none", [], "",
    )  # fmt: skip
    return 127 if bool((out == 255 * 127 * features).all()) else 63


def quantize_linears(model: nn.Module, rows_hint: int) -> int:
    """Swap every `nn.Linear` of a CPU model for an 8-bit one (a layer under two names is quantized
    once); returns how many. Blocks of 32 (models/linear/block_int8.py) where surge's kernel runs
    here, else oneDNN's per-channel kernel, with a WARNING saying why: that grid loses about twice
    as much (docs/bench/llama-server.md). Raises ValueError where neither can run."""
    build, kind = _layer_builder(rows_hint)
    count = swap_linears(cpu_linears(model), build)
    if not count:
        log.warning("quantization int8: the model has no nn.Linear layers to quantize (GPT-2's are Conv1D)")
    else:
        log.info("linear layers: int8 %s (%d layers)", kind, count)
    return count


def _layer_builder(rows_hint: int) -> tuple[Callable[[nn.Linear], nn.Module], str]:
    """What builds each 8-bit layer here, and how the log names it."""
    try:
        kernel = block_kernel.load()
    except (block_kernel.KernelUnavailable, OSError) as exc:
        log.warning("quantization int8: per output channel through oneDNN, not blocks of 32 (%s)", exc)
    else:
        kind = f"in blocks of 32, surge's kernel {kernel.path.name} ({kernel.isa})"
        tile_rows = TILE_ROWS if amx.bf16_tiles() else None
        if tile_rows is not None:
            kind += f", prefills of {tile_rows}+ rows on AMX bfloat16 tiles"
        return (lambda linear: BlockInt8Linear(linear, kernel, tile_rows)), kind
    if not hasattr(torch.ops.onednn, "qlinear_pointwise") or not torch.backends.mkldnn.is_available():
        raise ValueError("quantization int8: this torch build has no oneDNN int8 linear")
    try:
        qmax = activation_qmax()
    except RuntimeError as exc:
        raise ValueError(f"quantization int8: oneDNN's int8 linear fails on this CPU ({exc})") from exc
    bits = 8 if qmax == WEIGHT_QMAX else 7
    return (
        lambda linear: Int8Linear(linear, qmax, rows_hint)
    ), f"per channel, oneDNN, activations per token in {bits} bits"
