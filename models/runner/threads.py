"""torch's intra-op threads on CPU, chosen per engine step.

Decode steps run on `decode` threads. How many is measured at warm-up unless `--num-threads`
says (models/runner/decode_threads.py times a full-width decode step at each candidate count): more
threads make a step shorter, but the HTTP process (and a load client on the same machine) need
CPU for every token streamed, and a thread that shares its core with them stalls every step.
`choose_decode_threads` predicts each count's tokens/s with that share taken out and keeps the
best; on 2 cores that is 1 thread for the tiny `m` (a 2-thread step was 1.4x as fast alone, 0.85x
in serving) and 2 for `l` (1.45x alone, 1.33x in serving).

A burst of new prompts is different: while the engine prefills it, the HTTP process has already
handed the requests over and waits for first tokens, so the other cores are idle. A step that
computes at least `min_prompt_tokens` prompt tokens runs on `prefill` threads, where a big step
goes nearly twice as fast on two cores as on one (docs/engine.md, measurements); the next ordinary
step goes back to `decode`. Switching costs a `torch.set_num_threads` call, made only when the
count changes.
"""

from __future__ import annotations

import torch

from models.config import AUTO_THREADS
from models.runner.cpus import prefill_thread_count

# A step with fewer prompt tokens than this is a decode step with a new request or two riding
# along: its matmuls are too small for a second thread to pay for the contention.
DEFAULT_MIN_PROMPT_TOKENS = 128
# CPU seconds the HTTP side spends per streamed token: surge's HTTP process ~0.06 ms and the
# bench's load client on the same machine ~0.09 ms (measured at 32 streams on `m` and `l`).
HTTP_SECONDS_PER_TOKEN = 1.5e-4
# A count above the smallest best must predict this much more throughput to be chosen.
MIN_GAIN = 1.05


class StepThreads:
    def __init__(
        self, decode: int, prefill: int, min_prompt_tokens: int = DEFAULT_MIN_PROMPT_TOKENS, measure: bool = False
    ) -> None:
        if decode < 1 or prefill < 1:
            raise ValueError("thread counts must be positive")
        if min_prompt_tokens < 1:
            raise ValueError("min_prompt_tokens must be positive")
        self.decode = decode
        self.prefill = prefill
        self.min_prompt_tokens = min_prompt_tokens
        # The decode count is to be chosen at warm-up (models/runner/decode_threads.py), from 1 to prefill.
        self.measure = measure
        # Unknown until the first step sets it: torch's count is per thread, and this object is
        # built on the loading thread, not the engine's.
        self.current: int | None = None

    def before_step(self, num_prompt_tokens: int) -> None:
        """Set the thread count for a step that computes `num_prompt_tokens` prompt tokens."""
        wanted = self.prefill if num_prompt_tokens >= self.min_prompt_tokens else self.decode
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted


def step_threads(device: torch.device, num_threads: int, prefill_threads: int) -> StepThreads | None:
    """The policy for a model on `device`, or None where there is nothing to switch: on a GPU
    (CPU threads only launch kernels), with torch's own thread count (`num_threads` 0), or with
    `prefill_threads` equal to `num_threads`. `prefill_threads` 0: every CPU this process may use.
    `num_threads` AUTO_THREADS: 1 until warm-up measures the decode count, up to the prefill one."""
    if device.type != "cpu" or num_threads == 0:
        return None
    if num_threads == AUTO_THREADS:
        prefill = prefill_thread_count(1, prefill_threads)
        return StepThreads(1, prefill, measure=True) if prefill > 1 else None
    prefill = prefill_thread_count(num_threads, prefill_threads)
    return StepThreads(num_threads, prefill) if prefill > num_threads else None


def decode_candidates(max_threads: int) -> list[int]:
    """The counts warm-up times: 1, the powers of two below max_threads, max_threads - 1 (a core
    left to the HTTP side) and max_threads."""
    counts = {1, max_threads, max(1, max_threads - 1)}
    counts |= {1 << k for k in range(max_threads.bit_length()) if 1 << k < max_threads}
    return sorted(counts)


def predicted_tokens_per_s(step_seconds: float, threads: int, rows: int, num_cpus: int, http: float) -> float:
    """Tokens/s of full-width decode steps (`rows` tokens in `step_seconds` alone) on `threads`
    threads, while the HTTP side takes `http` CPU seconds a token: the engine's threads get the
    cores left, r = alone x min(1, (num_cpus - http x r) / threads), solved for r."""
    alone = rows / step_seconds
    return alone * min(1.0, num_cpus / (threads + alone * http))


def choose_decode_threads(
    step_seconds: dict[int, float], rows: int, num_cpus: int, http: float = HTTP_SECONDS_PER_TOKEN
) -> int:
    """The count with the best predicted tokens/s; a larger one only where it predicts MIN_GAIN
    times the smaller's."""
    best = min(step_seconds)
    best_rate = predicted_tokens_per_s(step_seconds[best], best, rows, num_cpus, http)
    for threads in sorted(step_seconds):
        rate = predicted_tokens_per_s(step_seconds[threads], threads, rows, num_cpus, http)
        if rate > best_rate * MIN_GAIN:
            best, best_rate = threads, rate
    return best
