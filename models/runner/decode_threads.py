"""Timing a full-width decode step at each candidate thread count, at warm-up (models/runner/threads.py
chooses from the timings). Runs the model directly on the runner's slots, outside the scheduler:
after warm-up every slot is free, and what this writes there is never read (a new sequence's
slot holds nothing it has not computed or loaded)."""

from __future__ import annotations

import itertools
import logging
import time

import torch

from models.runner.protocol import Runner
from models.runner.threads import StepThreads, choose_decode_threads, decode_candidates
from models.sampling.params import SamplingParams
from models.scheduler.output import PrefillChunk
from models.scheduler.sequence import Sequence

log = logging.getLogger("surge.engine")

PROMPT_TOKENS = 16
SAMPLES = 3  # clean timings wanted per count
# And the most warm-up spends waiting for them: 20 turns (a tiny model's steps take a millisecond,
# and a server in a busy test suite never gets clean ones), and at most 5 s for a large model.
MAX_TURNS = 20
BUDGET_S = 5.0
# A timing is clean where the process's CPU time reached this share of threads x wall: uncontended,
# a 2-thread decode step of the tiny `l` ran at 1.94-2.02 (OpenMP's waiting threads spin).
CLEAN_SHARE = 0.9
# Each thread past the first adds this share of one thread's speed to a decode step: measured on
# 2 cores, a second thread made a 32-row step of the tiny `m` 1.38x and of `l` 1.45-1.9x as fast.
PARALLEL_EFFICIENCY = 0.35


def measure_decode_threads(runner: Runner, threads: StepThreads | None, rows: int) -> float | None:
    """Time a `rows`-row decode step at each candidate count; decode on the best from now on, and
    return its step's seconds. Nothing to do (None) without a policy that asks for it (a fixed
    --num-threads, a GPU, one CPU)."""
    if threads is None or not threads.measure:
        return None
    timings = time_decode_steps(runner, rows, decode_candidates(threads.prefill))
    threads.decode = choose_decode_threads(timings, rows, threads.prefill)
    threads.current = None  # the next step sets its count, whatever the timing left behind
    steps = ", ".join(f"{count} thread(s) {1000 * seconds:.1f} ms" for count, seconds in timings.items())
    log.info("decode threads: %d (a %d-row decode step: %s)", threads.decode, rows, steps)
    return timings[threads.decode]


def time_decode_steps(
    runner: Runner, num_rows: int, candidates: list[int], samples: int = SAMPLES, budget_s: float = BUDGET_S
) -> dict[int, float]:
    """Seconds of one decode step of `num_rows` rows at each count of `candidates`, the rows
    prefilled once on the largest count. The counts take turns, and a timing counts only where
    this process got the CPU its threads asked for (CPU time >= CLEAN_SHARE x threads x wall): at
    start-up the HTTP process is still importing beside the engine, and a step sharing a core with
    it is timed slow, the many-thread one worst (on 2 cores such timings once made 1 thread look
    faster than 2 for `l`, and serving ran at 0.7x). Turns go on until every count has `samples`
    such timings, MAX_TURNS turns are done or `budget_s` has passed; each count's fastest clean
    timing, or an estimate where none was clean (`fastest`)."""
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
    clean: dict[int, list[float]] = {threads: [] for threads in candidates}
    every: dict[int, list[float]] = {threads: [] for threads in candidates}
    deadline = time.monotonic() + budget_s
    for turn in itertools.count():
        for threads in candidates:
            torch.set_num_threads(threads)
            if turn == 0:
                runner.forward(num_rows, [], seqs)  # untimed: the first step on a count builds its kernels
            cpu, start = time.process_time(), time.perf_counter()
            runner.forward(num_rows, [], seqs)
            wall = time.perf_counter() - start
            every[threads].append(wall)
            if had_its_cores(time.process_time() - cpu, wall, threads):
                clean[threads].append(wall)
        done = all(len(times) >= samples for times in clean.values())
        if done or turn + 1 >= MAX_TURNS or time.monotonic() > deadline:
            break
    return fastest(clean, every)


def had_its_cores(cpu_s: float, wall_s: float, threads: int) -> bool:
    """Whether a timing ran uncontended: the process got CLEAN_SHARE of `threads` cores throughout."""
    return cpu_s >= CLEAN_SHARE * threads * wall_s


def fastest(clean: dict[int, list[float]], every: dict[int, list[float]]) -> dict[int, float]:
    """Each count's fastest clean timing. A count with none (its steps always shared a core: the
    bench polls /ready every 0.1 s while a 2-thread step of `l` takes 0.07-0.1) gets the 1-thread
    timing divided by 1 + PARALLEL_EFFICIENCY x (threads - 1), if that is faster than its own
    fastest timing (a contended timing is only an upper bound); its fastest timing otherwise."""
    out = {threads: min(clean.get(threads) or times) for threads, times in every.items()}
    if clean.get(1):
        for threads in every:
            if threads > 1 and not clean.get(threads):
                out[threads] = min(out[threads], out[1] / (1 + PARALLEL_EFFICIENCY * (threads - 1)))
    return out
