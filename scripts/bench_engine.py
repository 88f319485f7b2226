"""Engine-only benchmark: the packed step (one forward per step) against the split one (prefill
and decode forwards) and the raw ceiling (`scripts/bench.py`'s batched decode loop at batch
`--concurrency`), in the same process, on the same model, interleaved rounds.

No HTTP: an `EngineCore` on this process's main thread (as in the engine process), driven by
a closed loop of `--concurrency` streams (each finished request is replaced at once by a new
one, as the serving benchmark's clients do; the first ones arrive `--ramp` per step, as a burst
reaches the engine through a server that parses requests one at a time, so later arrivals stay
staggered too), prompts of `--prompt-tokens` random ids, `--max-tokens` greedy tokens each with
eos ignored. This is the part of `make bench` that the engine alone decides; ratios within a
round are the figures to read (the VM drifts from minute to minute). Against the serving
benchmark's ratios, the difference is what HTTP, the load client and their share of the cores
cost.

    .venv/bin/python -m scripts.bench_engine --model-size m --concurrency 32 --rounds 3
    python3 -m scripts.bench_engine --device cuda --dtype bfloat16 --model-size l

NOTE: on CUDA no explicit synchronize is needed around the closed loop: the sampler copies
each step's tokens to the host (`.tolist()`) before the engine publishes them, so every
clock read in `publish` comes after the step's kernels have finished. The ceiling
synchronizes itself (scripts/benchkit/ceiling.py).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from models.config import ModelConfig, SchedulerConfig
from models.engine.core import EngineCore
from models.engine.outputs import RequestOutput
from models.loading.loader import LoadedModel, load_model
from models.loading.tiny import ensure_tiny
from models.runner.cpus import available_cpus, prefill_thread_count
from models.runner.model_runner import ModelRunner
from models.sampling.params import SamplingParams
from scripts.benchkit.ceiling import ceiling_worker, thread_counts

RUNNERS = ("packed", "split")


@dataclass(frozen=True, slots=True)
class LoopResult:
    tokens_per_s: float
    ttft_p99_s: float
    steps: int


def closed_loop(
    loaded: LoadedModel,
    packed: bool,
    concurrency: int,
    num_requests: int,
    prompt_tokens: int,
    max_tokens: int,
    ramp: int,
) -> LoopResult:
    assert loaded.model is not None
    config = SchedulerConfig(max_num_seqs=concurrency, max_model_len=prompt_tokens + max_tokens + 8)
    submitted = finished = 0
    begin = end = 0.0
    steps_before = 0
    started: dict[str, float] = {}
    ttfts: list[float] = []
    rng = random.Random(0)  # the same prompts for every runner and round
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    core: EngineCore

    def submit() -> None:
        nonlocal submitted
        request_id = f"r{submitted}"
        submitted += 1
        started[request_id] = time.perf_counter()
        core.add_request(request_id, [rng.randrange(3, loaded.vocab_size) for _ in range(prompt_tokens)], params)

    def publish(outputs: list[RequestOutput]) -> None:
        nonlocal finished, end
        now = time.perf_counter()
        for _ in range(min(ramp, concurrency - submitted)):  # the first arrivals, ramp per step
            submit()
        for out in outputs:
            if out.num_output_tokens == 1:
                ttfts.append(now - started[out.request_id])
            if out.finish_reason is not None:
                finished += 1
                if submitted < num_requests:
                    submit()
        if finished >= num_requests and not end:
            end = now
            core.stop()  # the loop ends once it reads this from its inbox

    def on_iteration() -> None:
        nonlocal begin, steps_before
        if not begin:  # the first call comes after warm-up
            begin, steps_before = time.perf_counter(), core.num_steps
            for _ in range(ramp):
                submit()

    core = EngineCore(loaded, config, publish, on_iteration=on_iteration)
    core.runner = ModelRunner(loaded.model, config.max_num_seqs, config.max_model_len or 256, packed=packed)
    # On this thread, the one that loaded the model, as in the engine process: a loop on another
    # thread pays OpenMP wake-ups on every op (models/engine/own_thread.py); here it made the
    # closed loop 1.15x slower.
    core.run()
    elapsed = end - begin
    steps = core.num_steps - steps_before
    ttfts.sort()
    return LoopResult(num_requests * max_tokens / elapsed, ttfts[int(0.99 * (len(ttfts) - 1))], steps)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", default="m", help="tiny model size (s, m, l)")
    parser.add_argument("--model-dir", type=Path, help="use this model directory instead of building a tiny one")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=0, help="requests per loop (default 4 x concurrency)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ramp", type=int, default=2, help="first requests arriving per step (concurrency: one burst)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--prefill-threads", type=int, default=0, help="torch threads for burst prefills (0 = every available CPU)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (the ceiling runs there too)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--no-ceiling", action="store_true", help="leave out the raw ceiling")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    num_requests = args.requests or 4 * args.concurrency
    model_dir = args.model_dir or ensure_tiny(size=args.model_size)
    # num_threads: load_model sets torch's thread count, which would otherwise undo --threads.
    # CPU threads matter on the CPU only (on a GPU they launch kernels): there, one count for all.
    on_cpu = torch.device(args.device).type == "cpu"
    prefill_threads = prefill_thread_count(args.threads, args.prefill_threads) if on_cpu else args.threads
    config = ModelConfig(
        str(model_dir), device=args.device, dtype=args.dtype, num_threads=args.threads, prefill_threads=prefill_threads
    )
    loaded = load_model(config)
    results: dict[str, list[LoopResult]] = {name: [] for name in RUNNERS}
    ceilings: list[float] = []
    for round_ in range(args.rounds):
        # Alternate which runner goes first, so neither always gets the cooler minute.
        order = RUNNERS if round_ % 2 == 0 else RUNNERS[::-1]
        for name in order:
            result = closed_loop(
                loaded,
                name == "packed",
                args.concurrency,
                num_requests,
                args.prompt_tokens,
                args.max_tokens,
                min(args.ramp, args.concurrency),
            )
            results[name].append(result)
            print(
                f"round {round_ + 1} {name:6s}: {result.tokens_per_s:7.1f} tok/s, TTFT p99 "
                f"{1000 * result.ttft_p99_s:6.1f} ms, {result.steps} steps",
                flush=True,
            )
        if not args.no_ceiling:
            # The model's best here: every thread count on the CPU (one on a GPU), loop or generate.
            counts = thread_counts(available_cpus()) if on_cpu else [args.threads]
            ceiling = ceiling_worker(
                str(model_dir), args.concurrency, args.max_tokens, 2, counts, args.device, args.dtype
            )
            ceilings.append(ceiling["tokens_per_s"])
            print(
                f"round {round_ + 1} ceiling: {ceilings[-1]:7.1f} tok/s (batch {args.concurrency}, "
                f"{ceiling['ceiling_method']}, {ceiling['ceiling_kernels']} kernels, "
                f"{ceiling['ceiling_threads']} threads)",
                flush=True,
            )
            torch.set_num_threads(args.threads)  # the ceiling leaves its own count behind
    ratios = [p.tokens_per_s / s.tokens_per_s for p, s in zip(results["packed"], results["split"], strict=True)]
    ttft = [p.ttft_p99_s / s.ttft_p99_s for p, s in zip(results["packed"], results["split"], strict=True)]
    threads = f"{args.threads} torch thread(s) ({prefill_threads} for burst prefills), " if on_cpu else ""
    print(
        f"\nmodel {model_dir.name}, {args.concurrency} streams x {num_requests} requests, "
        f"{args.prompt_tokens}-token prompts, {args.max_tokens} tokens each, first arrivals {args.ramp} per step, "
        f"{threads}{args.device} {args.dtype}"
    )
    print("| runner | tok/s (median) | TTFT p99 ms (median) | steps (median) |")
    print("|---|---|---|---|")
    for name in RUNNERS:
        rows = results[name]
        print(
            f"| {name} | {statistics.median(r.tokens_per_s for r in rows):.1f} "
            f"| {1000 * statistics.median(r.ttft_p99_s for r in rows):.1f} "
            f"| {statistics.median(r.steps for r in rows):.0f} |"
        )
    print(f"packed / split tokens/s per round: {', '.join(f'{r:.2f}x' for r in ratios)}")
    print(f"packed / split TTFT p99 per round: {', '.join(f'{r:.2f}x' for r in ttft)}")
    if ceilings:
        vs = [p.tokens_per_s / c for p, c in zip(results["packed"], ceilings, strict=True)]
        print(f"ceiling tok/s per round: {', '.join(f'{c:.1f}' for c in ceilings)}")
        print(f"packed / ceiling tokens/s per round: {', '.join(f'{r:.2f}x' for r in vs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
