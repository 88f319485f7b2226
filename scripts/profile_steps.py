"""Where an engine step's time goes, by kind of work: torch's profiler over the engine's own steps
(an `EngineCore` on this thread, as in the engine process), one prefill and a window of decode
steps, on any model; a table per phase of matmuls, attention, norms, activations, rotary
embeddings, copies and the rest (self CPU time of torch's ops), and the time outside torch's ops
(Python, the scheduler, sampling's numpy).

    python -m scripts.profile_steps --shape 0.5b                      # Qwen2.5-0.5B's shape, random weights
    python -m scripts.profile_steps --model-size l --rows 32 --prompt-tokens 2048

Read beside `python -m scripts.profile_serving` (py-spy on a serving run): this one names the
ops inside a step, that one the processes and Python around them. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from models.config import ModelConfig, SchedulerConfig
from models.engine.core import EngineCore
from models.loading.loader import load_model
from models.loading.tiny import ensure_tiny
from models.sampling.params import SamplingParams
from scripts.load_memory import SHAPES, build as build_shape, shape_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
# Op-name fragments per kind, first match wins (names as torch's profiler reports them).
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention", "softmax", "bmm", "baddbmm")),
    ("matmul", ("linear", "addmm", "aten::mm", "matmul", "qlinear", "mkldnn")),
    ("norm", ("rms_norm", "layer_norm", "rsqrt", "aten::pow", "aten::mean")),
    ("activation", ("silu", "gelu", "aten::mul")),
    ("rotary", ("aten::cos", "aten::sin", "aten::neg", "aten::cat")),
    ("copies", ("copy_", "index_put", "index_select", "index", "gather", "scatter", "aten::to", "contiguous")),
)


def kind_of(name: str) -> str:
    for kind, fragments in KINDS:
        if any(fragment in name for fragment in fragments):
            return kind
    return "other ops"


def run_phase(core: EngineCore, submit: list[tuple[list[int], SamplingParams]], steps: int) -> tuple[float, int]:
    """Submit the requests, run up to `steps` steps; the wall time and the steps taken."""
    for index, (ids, params) in enumerate(submit):
        core.add_request(f"p{time.monotonic_ns()}-{index}", ids, params)
    start, before = time.perf_counter(), core.num_steps
    for _ in range(steps):
        core._drain_inbox(block=False, timeout=None)  # what the engine loop does between steps
        if not core.scheduler.has_work:
            break
        core.step()
    return time.perf_counter() - start, core.num_steps - before


def table(prof: profile, wall_s: float, steps: int) -> list[str]:
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key.startswith("ProfilerStep") or event.key.startswith("## "):
            continue
        totals[kind_of(event.key)] = totals.get(kind_of(event.key), 0.0) + event.self_cpu_time_total / 1e6
    in_ops = sum(totals.values())
    totals["outside torch ops"] = max(0.0, wall_s - in_ops)
    lines = ["| kind | ms per step | share |", "|---|---|---|"]
    for kind, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        lines.append(f"| {kind} | {seconds / max(steps, 1) * 1e3:.2f} | {seconds / wall_s:.0%} |")
    top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
    lines += [
        "",
        "Top ops by self CPU time: " + ", ".join(f"`{e.key}` {e.self_cpu_time_total / 1e3:.0f} ms" for e in top),
    ]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", default="m")
    parser.add_argument("--shape", choices=sorted(SHAPES))
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--quantization", default="none", choices=("none", "int8"))
    parser.add_argument("--rows", type=int, default=32, help="sequences decoding together")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="the profiled prefill's prompt")
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for decode steps")
    parser.add_argument("--prefill-threads", type=int, default=0, help="0: every CPU")
    args = parser.parse_args(argv)
    if args.model_dir:
        model_dir = args.model_dir
    elif args.shape:
        model_dir = build_shape(args.shape, shape_dir(REPO_ROOT / ".cache" / "bench-models", args.shape))
    else:
        model_dir = ensure_tiny(size=args.model_size)
    loaded = load_model(
        ModelConfig(model=str(model_dir), dtype=args.dtype, quantization=args.quantization, num_threads=args.threads)
    )
    assert loaded.model is not None
    config = SchedulerConfig(max_num_seqs=max(args.rows, 1) + 1, max_model_len=args.prompt_tokens + 512)
    core = EngineCore(loaded, config, lambda outputs: None)
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(3, loaded.vocab_size) for _ in range(n)]

    greedy = SamplingParams(max_tokens=args.decode_steps * 4 + 8, temperature=0.0, ignore_eos=True)
    prefill_threads = args.prefill_threads or torch.get_num_threads()
    print(f"model {model_dir.name}, {args.dtype}/{args.quantization}, threads {args.threads}/{prefill_threads}")
    # Warm: every shape once.
    run_phase(core, [(prompt(args.prompt_tokens), SamplingParams(max_tokens=1, ignore_eos=True))], 64)
    decode_ids = f"d{time.monotonic_ns()}"
    for index in range(args.rows):
        core.add_request(f"{decode_ids}-{index}", prompt(16), greedy)
    run_phase(core, [], 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall, steps = run_phase(core, [], args.decode_steps)
    report = [f"## Decode: {args.rows} rows, {steps} steps, {wall / max(steps, 1) * 1e3:.1f} ms a step", ""]
    report += table(prof, wall, steps)
    # The decode rows out first: the prefill's own cost, not the decodes riding along.
    for index in range(args.rows):
        core.abort_request(f"{decode_ids}-{index}")
    run_phase(core, [], 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall, steps = run_phase(core, [(prompt(args.prompt_tokens), SamplingParams(max_tokens=1, ignore_eos=True))], 64)
    rate = args.prompt_tokens / wall
    report += ["", f"## Prefill alone: {args.prompt_tokens} tokens, {steps} steps, {wall:.2f} s ({rate:.0f} tok/s)", ""]
    report += table(prof, wall, steps)
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
