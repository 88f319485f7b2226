"""One step's plan, as the scheduler hands it to the engine (models/scheduler/scheduler.py): the
cache copies to make before the forward pass, the prompt chunks to compute, the sequences that
decode, and the order their sampled tokens come back in."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.scheduler.sequence import Sequence


@dataclass(frozen=True, slots=True)
class SlotMove:
    src: int
    dst: int
    num_tokens: int  # cache positions [0, num_tokens) hold data worth copying


@dataclass(frozen=True, slots=True)
class BlockCopy:
    """Prefix-cache blocks between a slot and the pool: the slot's blocks first_block, first_block
    + 1, ... (block_size tokens each) and the pool rows that hold (or will hold) them. In
    `moves` it is a save (slot to pool), in `loads` a load (pool to slot)."""

    slot: int
    first_block: int
    rows: list[int]


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    seq: Sequence
    start: int  # first prompt position of this chunk
    num_tokens: int

    @property
    def completes_prompt(self) -> bool:
        return self.start + self.num_tokens == self.seq.num_prefill_tokens


@dataclass(slots=True)
class SchedulerOutput:
    # Applied before the forward pass: first `moves`, in the order they arose since the last
    # step (a slot move fills a left sequence's hole; a BlockCopy keeps a slot's blocks in the
    # prefix cache, before any later move overwrites that slot), then `loads`, the cached
    # prefixes of the sequences admitted this step, into their new slots.
    moves: list[SlotMove | BlockCopy] = field(default_factory=list)
    loads: list[BlockCopy] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    num_slots: int = 0  # slots in use, prefilling ones included
    # The sequences that get a token this step, in the order the runner returns their logits: the
    # chunks that complete their prompt, then the decodes.
    sampled: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def sequences(self) -> list[Sequence]:
        return [chunk.seq for chunk in self.prefills] + self.decodes

    @property
    def num_prompt_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.prefills)
