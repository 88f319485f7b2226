"""float32 and bfloat16 linear layers on the CPU through oneDNN, with weights packed once at load.

torch runs `nn.Linear` on the CPU through MKL's sgemm. oneDNN (in every x86 CPU build of torch)
is much faster where MKL does not dispatch its best code, AMD's AVX-512 cores among them, once
the weight is reordered into oneDNN's blocked layout, which is done here once per layer instead
of inside every call. Measured on a 2-core AMD EPYC (Zen 4, AVX-512), the decode shapes of the
tiny models (8-64 rows against 256-3,072 features), GFLOPS per call:

| rows | MKL, 1 thread | oneDNN packed, 1 thread | MKL, 2 threads | oneDNN packed, 2 threads |
|---|---|---|---|---|
| 8 | 65 | 191 | 84 | 347 |
| 32 | 90 | 226 | 162 | 433 |
| 512 | 104 | 235 | 202 | 466 |

bfloat16 `F.linear` goes to oneDNN already, but reorders the weight inside every call; packed
once, the same products (bit for bit there) on the same Zen 4, 2 threads, ms per call, F.linear /
packed: Qwen2.5-0.5B's 896 x 9,728 at 1 row 0.65 / 0.25, 32 rows 2.66 / 1.50, 256 rows 11.5 /
10.5; its 896 x 151,936 output layer at 32 rows 35.7 / 24.4: a 32-row decode step of its 24
layers and output layer 128 -> 84 ms of matmuls.

Whether it pays is measured, not assumed: `pack_linears` times one of the model's own layers
both ways at load, per dtype, and keeps torch's own path where oneDNN is not faster (an Intel
core where MKL is at home), or where the packed op is missing or disagrees with `F.linear`
beyond the dtype's rounding. The results match torch's to rounding (the order of the sums
differs), not always bit for bit. Row counts are rounded up to a few sizes first
(models/runner/row_buckets.py): oneDNN builds and caches a kernel per input shape.

NOTE: `torch.ops.mkldnn._reorder_linear_weight` and `_linear_pointwise` are the private ops
torch's own compiler (inductor, weight freezing) emits for CPU linears; torch is pinned, and any
failure here leaves the model as it was.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from models.linear.swap import cpu_linears, swap_linears
from models.runner.row_buckets import pad_rows

log = logging.getLogger("surge.engine")

# oneDNN must beat torch's own path by this much on the probe layer to be used: a margin over timing noise.
MIN_SPEEDUP = 1.1
PACKED_DTYPES = (torch.float32, torch.bfloat16)
# How far the packed result may be from F.linear's: the order of the sums differs, so a few units
# of the last place of the output's dtype (bfloat16 keeps 8 bits of mantissa).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
# The probe times the largest layer's first rows up to this many weights (64 MiB in float32): a
# decode-sized product's speed, without copying a whole vocabulary projection to find it.
PROBE_ELEMENTS = 1 << 24
# (narrow, wide) dtypes a layer is widened between without rounding.
EXACT_WIDENING = {(torch.bfloat16, torch.float32), (torch.float16, torch.float32)}


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward on a weight packed for oneDNN; the original weight is not kept."""

    def __init__(self, linear: nn.Linear, rows_hint: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(pad_rows(rows), self.packed, self.bias, "none", [], "")
        return out[: rows.shape[0]].reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn"


def pack_linears(
    model: nn.Module, rows_hint: int, min_speedup: float | None = None, compute_dtype: torch.dtype | None = None
) -> int:
    """Swap every float32 and bfloat16 `nn.Linear` of a CPU model for a PackedLinear, where the
    probe finds oneDNN at least `min_speedup` (default MIN_SPEEDUP; 0: always) times as fast here
    on that dtype's largest layer; returns how many were swapped (0: the model is untouched).
    `rows_hint`: the rows oneDNN's layout is chosen for (the decode batch). `compute_dtype`: the
    dtype a model loaded narrower runs in (models/loading/widening.py): its bfloat16 and float16
    layers are widened to it one at a time, each as it is packed."""
    if not torch.backends.mkldnn.is_available():
        return 0
    sources = (*PACKED_DTYPES, torch.float16)
    pairs = [(source, _target(source, compute_dtype)) for source in sources]
    return sum(_pack_dtype(model, source, target, rows_hint, min_speedup) for source, target in pairs)


def _target(source: torch.dtype, compute_dtype: torch.dtype | None) -> torch.dtype:
    """What a `source` layer computes in: `compute_dtype` where widening to it is exact."""
    if compute_dtype is not None and (source, compute_dtype) in EXACT_WIDENING:
        return compute_dtype
    return source


def _pack_dtype(
    model: nn.Module, source: torch.dtype, target: torch.dtype, rows_hint: int, min_speedup: float | None
) -> int:
    if target not in PACKED_DTYPES:
        return 0
    linears = cpu_linears(model, source)
    if not linears:
        return 0
    name = str(target).removeprefix("torch.")
    probe = _probe_layer(max(linears, key=lambda item: item[2].weight.numel())[2], target)
    try:
        speedup = _probe(probe, rows_hint)
    except (RuntimeError, AttributeError) as exc:  # the private ops missing or failing in this build
        log.info("%s linear layers: torch's own (oneDNN's packed linear unavailable: %s)", name, exc)
        return 0
    if speedup < (MIN_SPEEDUP if min_speedup is None else min_speedup):
        log.info("%s linear layers: torch's own (oneDNN packed %.2fx on the probe layer)", name, speedup)
        return 0
    del probe  # one reference fewer: each layer's float weight goes as soon as it is packed
    # Largest first: a widened layer's copy and its packed one are in memory together, and while
    # the largest is packed the rest is still narrow (1.5B shape, float32 from bfloat16: the load's
    # peak 7,166 -> 6,205 MiB with the 933 MB output layer first rather than last).
    linears.sort(key=lambda site: site[2].weight.numel(), reverse=True)
    count = swap_linears(linears, lambda linear: PackedLinear(_widened(linear, target), rows_hint))
    log.info(
        "%s linear layers: oneDNN with packed weights (%d layers%s, %.2fx torch's own on the probe layer)",
        name,
        count,
        "" if source == target else f", widened from {str(source).removeprefix('torch.')} as packed",
        speedup,
    )
    return count


def _probe_layer(linear: nn.Linear, dtype: torch.dtype) -> nn.Linear:
    """`linear` in `dtype`, cut to its first PROBE_ELEMENTS weights' rows: the probe's copies (a
    packed one, a widened one) of a 151,936-row output layer would be 0.5-1 GiB of the load's peak."""
    rows = max(1, min(linear.out_features, PROBE_ELEMENTS // linear.in_features))
    if rows == linear.out_features and linear.weight.dtype == dtype:
        return linear
    bias = None if linear.bias is None else linear.bias.detach()[:rows]
    return _as_linear(linear.weight.detach()[:rows], bias, dtype)


def _widened(linear: nn.Linear, dtype: torch.dtype) -> nn.Linear:
    """`linear` itself where it is in `dtype`, else a copy in `dtype` (exact: a wider dtype)."""
    if linear.weight.dtype == dtype:
        return linear
    return _as_linear(linear.weight.detach(), None if linear.bias is None else linear.bias.detach(), dtype)


def _as_linear(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight.to(dtype, copy=True), requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias.to(dtype, copy=True), requires_grad=False)
    return layer


@torch.inference_mode()
def _probe(linear: nn.Linear, rows: int) -> float:
    """How much faster the packed op runs `linear` on `rows` rows than F.linear (best of a few
    timings each, interleaved, on one thread: at start-up the HTTP process is importing beside
    the engine, and on 2 cores a 2-thread probe sharing a core with it once read 0.87x for a
    kernel 1.9x as fast); raises if its result is not F.linear's to float32 rounding."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _timed_speedup(linear, rows)
    finally:
        torch.set_num_threads(saved)


def _timed_speedup(linear: nn.Linear, rows: int) -> float:
    x = torch.randn(rows, linear.in_features, dtype=linear.weight.dtype)
    packed = PackedLinear(linear, rows)
    expected, got = nn.functional.linear(x, linear.weight, linear.bias), packed(x)
    tolerance = TOLERANCE[linear.weight.dtype]
    if not torch.allclose(got, expected, rtol=tolerance, atol=tolerance * float(expected.abs().max())):
        raise RuntimeError("its result differs from F.linear's")

    def plain() -> torch.Tensor:
        return nn.functional.linear(x, linear.weight, linear.bias)

    def onednn() -> torch.Tensor:
        return packed(x)

    best = {plain: float("inf"), onednn: float("inf")}
    calls = max(1, int(2e7 // (2 * rows * linear.weight.numel())))  # ~20 MFLOP a timing
    for _ in range(5):
        for run in best:
            start = time.perf_counter()
            for _ in range(calls):
                run()
            best[run] = min(best[run], time.perf_counter() - start)
    return best[plain] / best[onednn]
