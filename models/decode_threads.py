"""Timing a full-width decode step at each candidate thread count, at warm-up (models/threads.py
chooses from the timings). Runs the model directly on the runner's slots, outside the scheduler:
after warm-up every slot is free, and what this writes there is never read (a new sequence's
slot holds nothing it has not computed or loaded)."""

from __future__ import annotations

import logging
import statistics
import time

import torch

from models.model_runner import Runner
from models.sampling_params import SamplingParams
from models.scheduler import PrefillChunk
from models.sequence import Sequence
from models.threads import StepThreads, choose_decode_threads, decode_candidates

log = logging.getLogger("surge.engine")

PROMPT_TOKENS = 16


def measure_decode_threads(runner: Runner, threads: StepThreads | None, rows: int) -> None:
    """Time a `rows`-row decode step at each candidate count; decode on the best from now on.
    Nothing to do without a policy that asks for it (a fixed --num-threads, a GPU, one CPU)."""
    if threads is None or not threads.measure:
        return
    timings = time_decode_steps(runner, rows, decode_candidates(threads.prefill))
    threads.decode = choose_decode_threads(timings, rows, threads.prefill)
    threads.current = None  # the next step sets its count, whatever the timing left behind
    steps = ", ".join(f"{count} thread(s) {1000 * seconds:.1f} ms" for count, seconds in timings.items())
    log.info("decode threads: %d (a %d-row decode step: %s)", threads.decode, rows, steps)


def time_decode_steps(runner: Runner, num_rows: int, candidates: list[int], reps: int = 5) -> dict[int, float]:
    """Seconds of one decode step of `num_rows` rows at each count of `candidates` (the median of
    `reps` after two untimed), the rows prefilled once on the largest count."""
    seqs = []
    for i in range(num_rows):
        seq = Sequence(f"threads-{i}", [0] * PROMPT_TOKENS, SamplingParams(max_tokens=2, ignore_eos=True))
        seq.slot = i
        seqs.append(seq)
    torch.set_num_threads(max(candidates))
    runner.forward(num_rows, [PrefillChunk(seq, 0, PROMPT_TOKENS) for seq in seqs], [])
    for seq in seqs:
        seq.num_computed_tokens = PROMPT_TOKENS
        seq.output_token_ids.append(0)  # each decode step rewrites position PROMPT_TOKENS
    timings = {}
    for threads in candidates:
        torch.set_num_threads(threads)
        samples = []
        for i in range(reps + 2):
            start = time.perf_counter()
            runner.forward(num_rows, [], seqs)
            if i >= 2:
                samples.append(time.perf_counter() - start)
        timings[threads] = statistics.median(samples)
    return timings
