"""What `--dtype auto` means on a CPU: bfloat16 where the CPU multiplies it in hardware and it
measures faster on the model's own shape, float32 everywhere else; and the reason, for the log.

Why measured and not read off the flags: a CPU without bf16 units (AVX2, AVX-512 before Cooper
Lake and Zen 4) runs a bf16 matmul several times slower than float32 (3-35x on a 2-core AMD EPYC
with AVX2, 1 to 256 rows of an 896 x 4,864 linear); with AMX tiles (Sapphire Rapids) a bare bf16
matmul ran 2.9x float32 and a 0.37B model served 2.05x float32's tokens/s. Between the two lie
AVX512-BF16 without AMX (Zen 4, Cooper Lake), where the gain depends on the shape, and VMs that
advertise AMX but fault on it (llama.cpp's AMX path died with SIGILL on a 2-core Sapphire Rapids
VM). So where bf16 is advertised, one linear of the model's shape is timed both ways in a child
process (a fault there cannot take the server down) at a decode step's rows on one thread and a
prefill's on every CPU; bf16 is chosen when it is faster at both, by MIN_SPEEDUP over the two
(geometric mean), and its error against float32 is bf16's rounding. The verdict is cached per CPU
model, flags, torch version and shape under `$SURGE_CACHE_DIR/probes` (~2 s saved a start).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from models.runner.cpus import ChildFailed, CpuFeatures, available_cpus, run_in_child

log = logging.getLogger("surge.loader")

MIN_SPEEDUP = 1.15  # bf16 over float32, geometric mean of decode and prefill, to be worth its rounding
MAX_ERROR = 0.02  # relative error of the probe's bf16 product against float32's (bf16 keeps 8 bits)
PROBE_TIMEOUT_S = 120.0
DECODE_ROWS, PREFILL_ROWS = 32, 512
PROBE_VERSION = 2  # 2: bfloat16 timed packed too; a cached verdict of an older probe is measured again

# argv: hidden, intermediate, prefill threads, decode rows, prefill rows. Prints {"decode": {...},
# "prefill": {...}}: each dtype's best of F.linear and oneDNN's packed linear (what the loader
# would run: models/linear/packed.py packs both where it pays).
_PROBE = r"""
import json, sys, time
import torch
import torch.nn.functional as F
from models.linear.packed import PackedLinear
hidden, inter, threads, DECODE_ROWS, PREFILL_ROWS = map(int, sys.argv[1:6])
torch.manual_seed(0)
linear = torch.nn.Linear(hidden, inter, bias=False)
w = linear.weight.detach()
linear_bf16 = torch.nn.Linear(hidden, inter, bias=False, dtype=torch.bfloat16)
linear_bf16.weight.data.copy_(w)
wb = linear_bf16.weight.detach()
def best(run, rows):
    calls = max(1, int(4e7 // (2 * rows * w.numel())))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - start) / calls)
    return min(times)
result = {}
with torch.inference_mode():
    for phase, rows, n in (("decode", DECODE_ROWS, 1), ("prefill", PREFILL_ROWS, threads)):
        torch.set_num_threads(n)
        x = torch.randn(rows, hidden)
        xb = x.bfloat16()
        want = F.linear(x, w)
        err = float((F.linear(xb, wb).float() - want).norm() / want.norm())
        ways = {}
        for dtype, layer, inp in (("f32", linear, x), ("bf16", linear_bf16, xb)):
            ways[dtype] = [lambda layer=layer, inp=inp: F.linear(inp, layer.weight)]
            try:  # oneDNN packs bf16 only on AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT: the loader skips it elsewhere
                ways[dtype].append(lambda packed=PackedLinear(layer, rows), inp=inp: packed(inp))
            except RuntimeError:
                pass
        f32 = min(best(run, rows) for run in ways["f32"])
        bf16 = min(best(run, rows) for run in ways["bf16"])
        result[phase] = {"rows": rows, "threads": n, "float32_s": f32, "bfloat16_s": bf16, "error": err}
print(json.dumps(result))
"""


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: str  # "float32" | "bfloat16"
    reason: str


def probe_cache_dir() -> Path:
    configured = os.environ.get("SURGE_CACHE_DIR")
    return (Path(configured) if configured else Path.home() / ".cache" / "surge") / "probes"


def choose_cpu_dtype(features: CpuFeatures, hidden: int, intermediate: int) -> DtypeChoice:
    """float32 or bfloat16 for a model whose MLP is hidden x intermediate, on this CPU."""
    if not features.native_bf16:
        return DtypeChoice(
            "float32",
            f"{features.summary()} has no bfloat16 matmul in hardware (neither AVX512_BF16 nor AMX-BF16): "
            "bfloat16 would run several times slower",
        )
    import torch  # the version is part of the cache key; the engine process has it loaded already

    threads = available_cpus()
    parts = [features.model_name, *sorted(features.flags), torch.__version__, str(hidden), str(intermediate)]
    key = "|".join([f"v{PROBE_VERSION}", *parts])
    cached = probe_cache_dir() / f"dtype-{hashlib.sha256(f'{key}|{threads}'.encode()).hexdigest()[:16]}.json"
    try:
        measured = json.loads(cached.read_text())
    except (OSError, ValueError):
        measured = run_probe(hidden, intermediate, threads)
        if isinstance(measured, dict):
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(measured))
    return verdict(features, measured)


def run_probe(hidden: int, intermediate: int, threads: int) -> dict[str, dict[str, float]] | str:
    """The probe's timings, or why there are none (a signal, a timeout, an exit status)."""
    args = [str(v) for v in (hidden, intermediate, threads, DECODE_ROWS, PREFILL_ROWS)]
    done = run_in_child(_PROBE, args, PROBE_TIMEOUT_S)
    if isinstance(done, ChildFailed):
        return done.why
    try:
        result: dict[str, dict[str, float]] = json.loads(done.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"printed {done[-200:]!r}"
    return result


def verdict(features: CpuFeatures, measured: dict[str, dict[str, float]] | str) -> DtypeChoice:
    """The choice from the probe's timings (or its failure)."""
    cpu = features.summary()
    if isinstance(measured, str):
        return DtypeChoice("float32", f"{cpu} advertises bfloat16, but the bfloat16 probe {measured}")
    try:
        speedups = {phase: m["float32_s"] / m["bfloat16_s"] for phase, m in measured.items()}
        error = max(m["error"] for m in measured.values())
    except (KeyError, TypeError, ZeroDivisionError):
        return DtypeChoice("float32", f"{cpu}: the bfloat16 probe's result was unreadable")
    said = ", ".join(f"{speedups[p]:.2f}x at {measured[p]['rows']:.0f} rows ({p})" for p in speedups)
    mean = math.prod(speedups.values()) ** (1 / len(speedups))
    if error > MAX_ERROR:
        return DtypeChoice("float32", f"{cpu}: bfloat16's probe product was off by {error:.3f} (relative)")
    if min(speedups.values()) < 1.0 or mean < MIN_SPEEDUP:
        return DtypeChoice("float32", f"{cpu}: bfloat16 measured {said} float32's speed, not worth its rounding")
    return DtypeChoice("bfloat16", f"{cpu}: bfloat16 measured {said} float32's speed")
