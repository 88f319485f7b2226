"""The roofline a benchmark's figures are read against: this machine's matmul peak per dtype and
its memory bandwidth, measured once per run, and a phase's achieved FLOP/s and bytes/s as a
fraction of them, so "close to the limit" is a number.

Peaks (`measure_peaks`, in a subprocess: torch stays out of the driver), on every CPU this
process may use:
- float32 / bfloat16: the best of square matmuls (512 to 2,048, while a call stays short) through torch, and for
  float32 also through oneDNN's packed linear (models/linear/packed.py), which is what surge runs;
- int8: surge's block kernel (models/linear/block_kernel.py) at 512 rows of a 4,096 x 4,096
  layer, where it runs here (else oneDNN's per-channel int8 linear);
- memory: reading a 512 MiB float32 tensor (a sum) and copying it (read + write), the better of
  the two as bytes moved per second: what a decode step does with the weights.

Costs per phase (`model_costs`, from config.json alone): a token's linear FLOPs are 2 x the
linear weights (the embedding table is a lookup; a tied output head counts, it is a matmul);
attention adds 4 x layers x heads x head_dim x the context it attends to. A decode step reads
every linear weight once (at the dtype's bytes: 4, 2, or 1.125 for int8 blocks of 32) plus each
sequence's K/V (2 x layers x kv heads x head_dim x context x the cache's bytes). These are the
model's own FLOPs and bytes; a figure near 1.0 of the peak is as fast as this machine goes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

WEIGHT_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.125}

# Runs in a subprocess (`python -c`): argv[1] = threads. Prints the peaks as JSON.
PEAKS_WORKER = r"""
import json, sys, time
import torch
import torch.nn.functional as F
threads = int(sys.argv[1])
torch.set_num_threads(threads)
def best(run, flops, tries=5):
    run()
    times = []
    for _ in range(tries):
        start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
    return flops / min(times)
peaks = {}
with torch.inference_mode():
    for dtype in (torch.float32, torch.bfloat16):
        top = 0.0
        for n in (512, 1024, 2048):  # larger while a call stays short (bf16 without units: 1 GFLOP/s)
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            rate = best(lambda: torch.mm(a, b), 2 * n ** 3, tries=3)
            top = max(top, rate)
            if 2 * (2 * n) ** 3 / rate > 0.5:
                break
        if dtype == torch.float32:
            from models.linear.packed import PackedLinear
            linear = torch.nn.Linear(2048, 2048, bias=False)
            packed, x = PackedLinear(linear, 512), torch.randn(2048, 2048)
            top = max(top, best(lambda: packed(x), 2 * 2048 ** 3))
        peaks[str(dtype).removeprefix("torch.")] = top
    linear, x = torch.nn.Linear(4096, 4096, bias=False), torch.randn(512, 4096)
    try:
        from models.linear import block_kernel
        from models.linear.block_int8 import BlockInt8Linear
        layer, how = BlockInt8Linear(linear, block_kernel.load()), "surge's block kernel"
    except Exception as exc:
        from models.linear.int8 import Int8Linear, activation_qmax
        layer, how = Int8Linear(linear, activation_qmax(), 512), f"oneDNN per channel ({exc})"
    peaks["int8"] = best(lambda: layer(x), 2 * 512 * 4096 * 4096)
    peaks["int8_kernel"] = how
    big = torch.empty(128 * 2 ** 20)  # 512 MiB of float32
    big.normal_()
    other = torch.empty_like(big)
    read = best(lambda: big.sum(), big.numel() * 4, tries=3)
    copy = best(lambda: other.copy_(big), big.numel() * 8, tries=3)
    peaks["memory_bytes_per_s"] = max(read, copy)
    peaks["memory_read_bytes_per_s"], peaks["memory_copy_bytes_per_s"] = read, copy
print(json.dumps(peaks))
"""


@dataclass(frozen=True)
class ModelCosts:
    linear_params: int  # weights multiplied each token (the tied output head included)
    layers: int
    heads: int
    kv_heads: int
    head_dim: int

    def flops_per_token(self, context: float) -> float:
        return 2.0 * self.linear_params + 4.0 * self.layers * self.heads * self.head_dim * context

    def kv_bytes_per_token(self, cache_bytes: float) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * cache_bytes


def model_costs(model_dir: Path) -> ModelCosts:
    """The costs of a Llama/Qwen2/Mistral-shaped model from its config.json (no torch)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config = config.get("text_config", config)
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    intermediate, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o; k, v
    mlp = 3 * hidden * intermediate  # gate, up, down
    return ModelCosts(layers * (attention + mlp) + vocab * hidden, layers, heads, kv_heads, head_dim)


def phase_roofline(
    costs: ModelCosts,
    peaks: dict[str, Any],
    dtype: str,
    tokens_per_s: float,
    context: float,
    steps_per_s: float | None = None,
) -> dict[str, float]:
    """Achieved FLOP/s and bytes/s of a phase and their fractions of the peaks. `steps_per_s`
    (decode): each step reads the weights once; None (prefill): the weights' reads are amortized
    over the step's tokens and left out, FLOP/s is the limit."""
    kernel_dtype = "int8" if dtype == "int8" else dtype
    flops = tokens_per_s * costs.flops_per_token(context)
    cache_bytes = 2.0 if dtype in ("bfloat16", "float16") else 4.0
    moved = tokens_per_s * context * costs.kv_bytes_per_token(cache_bytes)
    if steps_per_s is not None:
        moved += steps_per_s * costs.linear_params * WEIGHT_BYTES[dtype]
    peak_flops = float(peaks.get(kernel_dtype) or peaks["float32"])
    return {
        "flops_per_s": flops,
        "flops_of_peak": flops / peak_flops,
        "bytes_per_s": moved,
        "bytes_of_peak": moved / float(peaks["memory_bytes_per_s"]),
    }


def measure_peaks(threads: int) -> dict[str, Any]:
    """PEAKS_WORKER in a subprocess of this interpreter, from the repo root."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", PEAKS_WORKER, str(threads)], cwd=root, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"measuring the machine's peaks failed:\n{done.stderr[-2000:]}")
    peaks: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return peaks


def render_peaks(peaks: dict[str, Any]) -> list[str]:
    """The peaks as one markdown line."""
    return [
        f"Roofline of this machine (every CPU): float32 {peaks['float32'] / 1e9:,.0f} GFLOP/s, bfloat16 "
        f"{peaks['bfloat16'] / 1e9:,.0f} GFLOP/s, int8 {peaks['int8'] / 1e9:,.0f} GOP/s ({peaks['int8_kernel']}), "
        f"memory {peaks['memory_bytes_per_s'] / 1e9:,.1f} GB/s (read {peaks['memory_read_bytes_per_s'] / 1e9:,.1f}, "
        f"copy {peaks['memory_copy_bytes_per_s'] / 1e9:,.1f})."
    ]


def as_dict(costs: ModelCosts) -> dict[str, Any]:
    return asdict(costs)


def render_decode_rows(
    rows: list[dict[str, Any]], costs: ModelCosts, peaks: dict[str, Any], dtype: str, max_tokens: int
) -> list[str]:
    """The serving rows' decode roofline: a closed loop of N streams is mostly decode steps of N
    rows, so steps/s ~ tokens/s / N, each reading every weight once, at a context of the mean
    prompt plus half the new tokens."""
    lines = [
        "",
        "### Roofline",
        "",
        *render_peaks(peaks),
        "",
        "Decode as a fraction of those peaks (estimates: steps/s = tokens/s / streams; each step reads every "
        "weight once and each stream's K/V; the ceiling's rows on the same terms).",
        "",
        "| N | system | tokens/s | GFLOP/s | of peak | GB/s | of peak |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        tokens_per_s, streams = row.get("tokens_per_s"), row.get("concurrency")
        if not tokens_per_s or not streams or row.get("load") not in (None, "batch", "closed"):
            continue
        context = float(row.get("mean_prompt_tokens") or 32) + max_tokens / 2
        got = phase_roofline(costs, peaks, dtype, tokens_per_s, context, steps_per_s=tokens_per_s / streams)
        lines.append(
            f"| {streams} | {row['system']} | {tokens_per_s:,.0f} | {got['flops_per_s'] / 1e9:,.1f} "
            f"| {got['flops_of_peak']:.2f} | {got['bytes_per_s'] / 1e9:,.1f} | {got['bytes_of_peak']:.2f} |"
        )
    return lines
