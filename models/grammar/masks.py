"""One step's grammar masks, and the worker that computes them while the model runs.

A constrained row's mask depends only on the tokens its matcher has consumed, all known before
the step's forward pass starts; so the engine hands the step's matchers to `MaskWorker` first
and collects the masks after the forward pass, which then hides the masks' cost. llguidance
drops the GIL while it computes a mask, and torch drops it inside every op, so the two overlap
on two cores. On one core they take turns, for the price of one thread hand-off a step.

The sampler reads `GrammarMasks`: the packed bitmask (one bit per token, as llguidance writes it)
to test a single token, and the unpacked boolean mask to forbid whole rows of logits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from llguidance import LLMatcher

from models.grammar.compiler import fill_bitmask


def unpack_disallowed(bitmask: np.ndarray, vocab_size: int) -> torch.Tensor:
    """(n, vocab_size) bool on the CPU, True where a row of `bitmask` forbids the token.

    One `unpackbits` over all rows turns the bits into bytes, far cheaper than a torch
    bit-twiddling kernel (llguidance's own torch helper needs torch.compile, seconds on first use).
    """
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, count=vocab_size, bitorder="little")  # (n, V)
    # Compared in numpy, not torch: this runs on the mask worker's thread (MaskWorker says why).
    return torch.from_numpy(allowed == 0)


def fill_disallowed(matchers: Sequence[LLMatcher], vocab_size: int) -> torch.Tensor:
    """(n, vocab_size) bool, True where matchers[i] forbids the token next. On the CPU."""
    return unpack_disallowed(fill_bitmask(matchers, vocab_size), vocab_size)


@dataclass(frozen=True, slots=True)
class GrammarMasks:
    """`bitmask[k]` and `disallowed[k]` belong to the step's row `rows[k]`."""

    rows: list[int]  # sorted positions of the constrained rows in the step
    bitmask: np.ndarray  # (len(rows), ceil(V / 32)) int32: bit t of a row set iff token t is allowed
    disallowed: torch.Tensor  # (len(rows), V) bool on the CPU: True where the token is forbidden
    seconds: float  # spent computing them, wherever that was

    @classmethod
    def compute(cls, rows: list[int], matchers: Sequence[LLMatcher], vocab_size: int) -> GrammarMasks:
        start = time.perf_counter()
        bitmask = fill_bitmask(matchers, vocab_size)
        disallowed = unpack_disallowed(bitmask, vocab_size)
        return cls(rows, bitmask, disallowed, time.perf_counter() - start)

    def allows(self, k: int, token_id: int) -> bool:
        """Whether row `rows[k]`'s grammar allows `token_id` next: one bit, no full mask read."""
        return bool((int(self.bitmask[k, token_id >> 5]) >> (token_id & 31)) & 1)

    def apply(self, x: torch.Tensor, group: list[int]) -> None:
        """Sets x's forbidden logits to -inf, in place; x (n, V) holds the step's rows at `group`."""
        mask_of = {row: k for k, row in enumerate(self.rows)}
        picked = [(j, mask_of[row]) for j, row in enumerate(group) if row in mask_of]
        if not picked:
            return
        masks = self.disallowed
        if len(picked) < len(self.rows):
            masks = masks.index_select(0, torch.tensor([k for _, k in picked]))
        masks = masks.to(x.device, non_blocking=True)
        if len(picked) == len(group):  # every row of the group constrained: one call
            x.masked_fill_(masks, float("-inf"))
            return
        index = torch.tensor([j for j, _ in picked], device=x.device)
        x.index_copy_(0, index, x.index_select(0, index).masked_fill_(masks, float("-inf")))

    def covers(self, group: list[int]) -> bool:
        return not set(group).isdisjoint(self.rows)


def _serial_torch() -> None:
    torch.set_num_threads(1)  # this thread's count only (OpenMP's is per thread)


class MaskWorker:
    """One background thread that computes a step's masks; owned by the engine.

    Only the engine thread calls `start`, and it waits for the result before the step's
    matchers consume their tokens, so a matcher is never read and advanced at once.

    The thread runs no parallel torch op. torch's OpenMP runtime (libgomp) gives every thread
    that runs one a team of workers of its own, and once the process holds more of those threads
    than CPUs, idle workers sleep between parallel regions instead of spinning: every op of every
    later step then pays a wake-up. When this thread unpacked masks with a torch compare, one
    batch of 8 rows' masks (8 x 8,192 tokens, past torch's grain for going parallel) made a
    32-row decode step of the tiny `m` at 2 threads 6.4 -> 9.9 and 5.6 -> 8.2 ms for the rest of
    the process's life (2 AVX2 cores, two runs; serial here: 8.1 -> 7.9 and 7.6 -> 8.4). With a
    real model's vocabulary one row is enough."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self, rows: list[int], matchers: Sequence[LLMatcher]) -> Future[GrammarMasks] | None:
        """The masks of `matchers` (those of the step's rows at `rows`), computing; None if none."""
        if not rows:
            return None
        with self._lock:
            if self._executor is None:  # made on first use: most servers never see a grammar
                self._executor = ThreadPoolExecutor(
                    1, thread_name_prefix="surge-grammar-masks", initializer=_serial_torch
                )
            executor = self._executor
        return executor.submit(GrammarMasks.compute, rows, list(matchers), self.vocab_size)

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
