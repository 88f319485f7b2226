"""What the engine asks of a runner: `ModelRunner` (models/runner/model_runner.py), or the echo
model's `EchoRunner` (models/runner/echo.py)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

import torch

from models.scheduler.output import BlockCopy, PrefillChunk, SlotMove
from models.scheduler.sequence import Sequence


class Runner(Protocol):
    device: torch.device

    def apply_moves(self, moves: Seq[SlotMove | BlockCopy]) -> None:
        """Slot moves and prefix-cache saves, in order."""
        ...

    def apply_loads(self, loads: Seq[BlockCopy]) -> None:
        """Cached prefixes into their new slots."""
        ...

    def release_slots(self, first_slot: int, end_slot: int) -> None:
        """Slots [first_slot, end_slot) are free: their K/V memory may go back to the system."""
        ...

    def release_tail(self, slot: int, first_position: int) -> None:
        """The slot's positions from `first_position` on are unused: their memory may go back."""
        ...

    def kv_block_bytes(self, block_size: int) -> int:
        """K/V bytes of `block_size` tokens; 0 when this runner keeps no K/V."""
        ...

    def kv_pool(self, block_size: int, num_rows: int) -> None:
        """Set up the prefix cache's pool, at most `num_rows` blocks."""
        ...

    def forward(self, num_slots: int, chunks: Seq[PrefillChunk], decodes: Seq[Sequence]) -> torch.Tensor:
        """Logits (K, V) float32: one row per chunk that completes its prompt (in chunks order),
        then one per decoding sequence (in decodes order)."""
        ...
