"""The raw ceiling: the model's best batched greedy decode on this machine, no server at all.

What a serving system at concurrency B is measured against: B prompts of CEILING_PROMPT_TOKENS
random tokens, prefilled together, then one token per row per step. Two ways of running it, each
at every torch thread count from 1 to the CPUs this process may use (on a GPU, one count: CPU
threads only launch kernels there), each with torch's own linear kernels and, on the CPU, with
surge's oneDNN packed ones (models/linear/packed.py), and the ceiling is the best of all:
- `loop`: a hand-written decode loop over a `DynamicCache` (no `generate()` machinery, about 2 ms
  of Python a step less on tiny models); its prefill runs on every CPU, as a burst's prefill may;
- `generate`: Hugging Face's `model.generate`, greedy, eos ignored (min_new_tokens).
The ceiling is the model's best, not the thread policy of the system under test: a server that
decodes on one thread is measured against what both cores could do.

Runs in a subprocess of its own (`python -m scripts.bench --ceiling-worker JSON`), so torch stays
out of the driver's process; `scripts/bench_engine.py` calls `ceiling_worker` in its own process.
"""

from __future__ import annotations

import time
from typing import Any

CEILING_PROMPT_TOKENS = 32
METHODS = ("loop", "generate")


def thread_counts(max_threads: int) -> list[int]:
    """Every count from 1 to max_threads: two cores are 1 and 2; sixteen are sixteen runs."""
    return list(range(1, max(1, max_threads) + 1))


def ceiling_worker(
    model_dir: str,
    batch: int,
    new_tokens: int,
    runs: int,
    threads: list[int],
    device: str = "cpu",
    dtype: str = "float32",
) -> dict[str, Any]:
    """The best tokens/s over METHODS x `threads` (each the best of `runs` after a warmup), with
    what reached it, and every combination's figure in `tried`."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from models.linear.packed import pack_linears

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, model.config.vocab_size, (batch, CEILING_PROMPT_TOKENS), generator=generator)  # (B, T)
    prompt = prompt.to(device)
    on_cuda = torch.device(device).type == "cuda"
    # CUDA runs asynchronously: wait for the device before each clock read, or it times the launches.
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    all_cpus = max(threads)

    @torch.inference_mode()
    def loop(num_threads: int) -> tuple[float, float]:
        sync()
        start = time.perf_counter()
        torch.set_num_threads(all_cpus)
        out = model(input_ids=prompt, cache=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)
        next_ids = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        sync()
        prefill_s = time.perf_counter() - start
        torch.set_num_threads(num_threads)
        for _ in range(new_tokens - 1):
            out = model(input_ids=next_ids, cache=out.cache, use_cache=True)
            next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
        sync()
        return time.perf_counter() - start, prefill_s

    @torch.inference_mode()
    def generate(num_threads: int) -> tuple[float, float]:
        torch.set_num_threads(num_threads)
        sync()
        start = time.perf_counter()
        model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
        )
        sync()
        return time.perf_counter() - start, float("nan")

    tried: list[dict[str, Any]] = []
    for kernels in ("torch", "onednn"):
        if kernels == "onednn" and (on_cuda or not pack_linears(model, rows_hint=batch, min_speedup=0.0)):
            break  # surge's packed linears (models/linear/packed.py): on the CPU, where this torch has them
        for method, run in (("loop", loop), ("generate", generate)):
            for num_threads in threads:
                run(num_threads)  # warmup
                total_s, prefill_s = min(run(num_threads) for _ in range(runs))
                tried.append(
                    {"kernels": kernels, "method": method, "threads": num_threads}
                    | {"tokens_per_s": batch * new_tokens / total_s, "best_s": total_s, "prefill_s": prefill_s}
                )
    best = max(tried, key=lambda t: t["tokens_per_s"])
    decode_s = best["best_s"] - (best["prefill_s"] if best["method"] == "loop" else 0.0)
    return {
        "tokens_per_s": best["tokens_per_s"],
        "best_s": best["best_s"],
        "ceiling_method": best["method"],
        "ceiling_kernels": best["kernels"],
        "ceiling_threads": best["threads"],
        "decode_step_ms": 1000 * decode_s / max(new_tokens - (best["method"] == "loop"), 1),
        "tried": tried,
    }
