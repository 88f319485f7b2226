"""The echo model: a model runner whose forward pass costs nothing, for measuring serving overhead.

`--model echo` serves it. Everything else runs as for a real model: the scheduler plans each
step, the sampler takes the greedy fast path (one argmax over (B, V) logits), the incremental
detokenizer turns ids into text, and the outputs travel the same hand-off to the event loop
and out as SSE. Only the torch forward is replaced, so a benchmark against it measures what
surge itself costs per token. The tokenizer is the embedded tiny model's (trained in-process,
about a second), so prompts encode and outputs decode like the tiny model's.

It knows nothing of HTTP. NOTE: there is no KV cache: every step's logits come from one table
built up front, so slot moves are no-ops and the runner keeps no per-sequence state.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence as Seq

import torch

from models.scheduler.output import BlockCopy, PrefillChunk, SlotMove
from models.scheduler.sequence import Sequence

ECHO_MODEL = "echo"
# The text the echo model writes, over and over; each of its tokens is printable.
ECHO_TEXT = " surge echo streams tokens."
# A chosen token's logit against 0 for every other: even at temperature 1 over an 8192-token
# vocabulary it carries all but ~1e-5 of the mass, so sampled requests echo too.
_CHOSEN_LOGIT = 30.0


class EchoRunner:
    """The `ModelRunner` interface (apply_moves, apply_loads, kv_pool, forward, device) without a model.

    Row r of a step's logits picks token `cycle[(r + step) % len(cycle)]`: deterministic,
    different from step to step, and a slice of one prebuilt table, so a step allocates nothing.
    """

    def __init__(self, token_ids: Seq[int], vocab_size: int, max_num_seqs: int) -> None:
        if not token_ids:
            raise ValueError("the echo model needs at least one token id to write")
        if any(not 0 <= t < vocab_size for t in token_ids):
            raise ValueError("echo token ids must lie inside the vocabulary")
        self.device = torch.device("cpu")
        self.cycle = list(token_ids)
        self.max_num_seqs = max_num_seqs
        self._num_steps = 0
        num_rows = max_num_seqs + len(self.cycle)
        table = torch.zeros(num_rows, vocab_size, dtype=torch.float32)  # (R, V)
        rows = torch.arange(num_rows)
        table[rows, torch.tensor(self.cycle)[rows % len(self.cycle)]] = _CHOSEN_LOGIT
        self._table = table

    def apply_moves(self, moves: Seq[SlotMove | BlockCopy]) -> None:
        """Nothing to move: the echo model keeps no per-slot state."""

    def apply_loads(self, loads: Seq[BlockCopy]) -> None:
        """Nothing to load: the echo model caches nothing."""

    def release_slots(self, first_slot: int, end_slot: int) -> None:
        """No K/V to release."""

    def release_tail(self, slot: int, first_position: int) -> None:
        """No K/V to release."""

    def kv_block_bytes(self, block_size: int) -> int:
        return 0  # no K/V: no prefix cache

    def kv_pool(self, block_size: int, num_rows: int) -> None:
        raise RuntimeError("the echo model keeps no K/V to cache")

    def forward(self, num_slots: int, chunks: Seq[PrefillChunk], decodes: Seq[Sequence]) -> torch.Tensor:
        """Logits (K, V) float32: a row per chunk that completes its prompt, then per decode."""
        return self._logits(sum(chunk.completes_prompt for chunk in chunks) + len(decodes))

    def _logits(self, num_rows: int) -> torch.Tensor:
        if num_rows > self.max_num_seqs:
            raise ValueError(f"{num_rows} rows asked of an echo runner sized for {self.max_num_seqs}")
        offset = self._num_steps % len(self.cycle)
        self._num_steps += 1
        return self._table[offset : offset + num_rows]  # a view: (num_rows, V)


def echo_token_ids(encode: Callable[[str], list[int]], eos_token_ids: Collection[int]) -> list[int]:
    """The ids the echo model cycles through: ECHO_TEXT's, minus any end-of-sequence id."""
    return [t for t in encode(ECHO_TEXT) if t not in eos_token_ids]
