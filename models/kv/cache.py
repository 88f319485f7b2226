"""The slot KV cache: one preallocated row of K/V per running sequence, written in place.

transformers' own caches either copy the whole cache on every step (`DynamicCache` grows by
`torch.cat`) or share one write position across the batch (`StaticCache`). Continuous
batching needs sequences of different lengths side by side, so each layer keeps
    keys, values: (num_slots, kv_heads, capacity + 1, head_dim)
and every row is written at its own position. Column `capacity` is a scratch column: padding
tokens write there and no mask ever lets a query read it.

The model runner sets a `StepPlan` before each forward; attention layers then call
`update()` once per layer, which writes the new K/V and returns what attention reads.

How memory follows use:
- On the CPU (`reserve=True`) the capacity is max_model_len from the start, each tensor in an
  anonymous mapping of its own that reserves address space, not memory: the kernel commits a page
  when a token is first written into it, and a read of a page never written sees zeros. So memory
  follows the tokens each slot has held, never grows by copying, and `release()` hands a free
  slot's pages back (they read as zeros again).
- Elsewhere (and on the CPU where the mapping is refused) capacity grows by doubling up to
  max_model_len: every slot as long as the longest sequence so far. NOTE: growing copies the
  whole cache while every stream waits; measured on the CPU for the tiny `l` at 32 slots, 1,024
  to 2,048 positions, 4.6 s and 1.2 GiB more memory, which is why the CPU reserves instead.
"""

from __future__ import annotations

import logging
import mmap
import platform
import sys
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

log = logging.getLogger("surge.engine")

# Linux's flag (Python's mmap module lacks the name before 3.13): no swap space is accounted for
# the reservation, so the overcommit heuristic does not refuse a mapping larger than memory that
# will never be filled. Under strict overcommit it is ignored. Its value is 0x4000 on x86 and arm
# only (powerpc, sparc and mips number it otherwise): elsewhere none, and a refused mapping falls
# back to a cache allocated whole.
_NORESERVE_ARCHES = ("x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "armv7l")
_MAP_NORESERVE = getattr(
    mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" and platform.machine().lower() in _NORESERVE_ARCHES else 0
)
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True, slots=True)
class ChunkRows:
    """A prompt chunk's tokens in a packed step: rows [start, start + num_tokens), all of one slot."""

    start: int
    num_tokens: int
    slot: int
    # It starts its prompt (keys: its own tokens) and fits any sliding window: attended causally
    # without a mask when it runs alone (models/runner/attention.py).
    fresh: bool = False


@dataclass(slots=True)
class StepPlan:
    # Decode: rows are slots [0, num_rows), write_pos (B,). Prefill: slots (B,), write_pos (B, T).
    # Packed: one (1, N) row of tokens; token i writes (slots[i], write_pos[i]); the first
    # num_rows tokens are the decode block (token i is slot i), then each chunk's tokens.
    write_pos: torch.Tensor
    read_len: int  # attention reads positions [0, read_len)
    slots: torch.Tensor | None = None  # None means the contiguous block [0, num_rows)
    num_rows: int = 0
    chunks: tuple[ChunkRows, ...] | None = None  # set for a packed step only
    # Packed: positions the decode block and the chunks attend to ([0, n)), each at most
    # read_len; a burst of new prompts beside long-running streams reads only its own length.
    decode_len: int = 0
    chunk_len: int = 0
    # Packed steps with several chunks attend them as one padded batch: (C, T) row indices of
    # each chunk's tokens (short chunks repeat their last row), the chunks' slots (C,), and
    # the indices of the real rows among the C*T padded ones, in row order.
    chunk_index: torch.Tensor | None = None
    chunk_slots: torch.Tensor | None = None
    chunk_real: torch.Tensor | None = None
    # Every chunk starts its prompt (its keys are its own tokens, nothing earlier) and fits any
    # sliding window: plain causal attention, no mask for the chunks (the mask covers the decode
    # block alone). SDPA then skips the masked half: flash attention on CUDA, and on CPU the
    # blocks above the diagonal.
    causal_chunks: bool = False


class SlotLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, owner: SlotCache) -> None:
        super().__init__()
        self.owner = owner
        self._mappings: list[mmap.mmap] = []  # keys' and values' reservations, where reserved

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, kv_heads, _, head_dim = key_states.shape
        shape = (self.owner.num_slots, kv_heads, self.owner.capacity + 1, head_dim)
        if self.owner.reserve and key_states.device.type == "cpu":
            reserved = [_reserve(shape, key_states.dtype), _reserve(shape, value_states.dtype)]
            if reserved[0] is not None and reserved[1] is not None:
                (self.keys, key_map), (self.values, value_map) = reserved  # type: ignore[misc]
                self._mappings = [key_map, value_map]
                self.is_initialized = True
                return
            self.owner.warn_unreserved()
        # Zeros, not empty: masked positions are multiplied by zero weights, and NaN * 0 = NaN.
        self.keys = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros(shape, dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def release(self, first: int, end: int) -> None:
        """Hand slots [first, end)'s pages back to the kernel (reserved tensors only); the pages
        wholly inside the range, so a neighbour's row is never touched."""
        for tensor, mapping in zip((self.keys, self.values), self._mappings, strict=False):
            assert tensor is not None
            slot_bytes = tensor.stride(0) * tensor.element_size()
            _drop(mapping, first * slot_bytes, end * slot_bytes)

    def release_tail(self, slot: int, first_position: int) -> None:
        """Hand back the slot's positions from `first_position` on, in each K/V head's row."""
        for tensor, mapping in zip((self.keys, self.values), self._mappings, strict=False):
            assert tensor is not None
            size = tensor.element_size()
            slot_bytes, row_bytes, position_bytes = (tensor.stride(i) * size for i in range(3))
            for head in range(tensor.shape[1]):
                row = slot * slot_bytes + head * row_bytes
                _drop(mapping, row + first_position * position_bytes, row + row_bytes)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None
        plan = self.owner.plan
        if plan is None:
            raise RuntimeError("SlotCache.update called without a step plan")
        if plan.chunks is not None:  # packed: (1, H, N, D), token i into (slots[i], :, write_pos[i])
            self.keys[plan.slots, :, plan.write_pos] = key_states[0].transpose(0, 1)  # (N, H, D)
            self.values[plan.slots, :, plan.write_pos] = value_states[0].transpose(0, 1)
            # Every slot, read_len positions: the packed attention picks each group's rows (views).
            return self.keys[:, :, : plan.read_len], self.values[:, :, : plan.read_len]
        if plan.slots is None:  # decode: one new token per row, rows are slots [0, B)
            rows = self.owner.row_index(plan.num_rows)
            self.keys[rows, :, plan.write_pos] = key_states[:, :, 0]  # (B, H, D)
            self.values[rows, :, plan.write_pos] = value_states[:, :, 0]
            return self.keys[: plan.num_rows, :, : plan.read_len], self.values[: plan.num_rows, :, : plan.read_len]
        # prefill: (B, H, T, D) into (slot, :, pos) for each row and column
        slots = plan.slots[:, None]
        self.keys[slots, :, plan.write_pos] = key_states.transpose(1, 2)  # (B, T, H, D)
        self.values[slots, :, plan.write_pos] = value_states.transpose(1, 2)
        return self.keys[plan.slots, :, : plan.read_len], self.values[plan.slots, :, : plan.read_len]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        plan = self.owner.plan
        return (plan.read_len if plan else 0), 0

    def get_seq_length(self) -> int:
        plan = self.owner.plan
        return plan.read_len if plan else 0

    def get_max_length(self) -> int:
        return self.owner.capacity

    def grow(self, capacity: int) -> None:
        if self.keys is None or self.values is None:
            return
        old = self.keys.shape[2] - 1
        shape = (self.keys.shape[0], self.keys.shape[1], capacity + 1, self.keys.shape[3])
        keys = torch.zeros(shape, dtype=self.keys.dtype, device=self.keys.device)
        values = torch.zeros(shape, dtype=self.values.dtype, device=self.values.device)
        keys[:, :, :old] = self.keys[:, :, :old]
        values[:, :, :old] = self.values[:, :, :old]
        self.keys, self.values = keys, values

    def move(self, src: int, dst: int, num_tokens: int) -> None:
        if self.keys is None or self.values is None or num_tokens == 0:
            return
        self.keys[dst, :, :num_tokens] = self.keys[src, :, :num_tokens]
        self.values[dst, :, :num_tokens] = self.values[src, :, :num_tokens]


class SlotCache(Cache):
    def __init__(
        self, num_layers: int, num_slots: int, max_len: int, initial_capacity: int = 256, reserve: bool = False
    ) -> None:
        """`reserve`: on the CPU, map every slot's full max_len at once (see the module's docstring)."""
        self.num_slots = num_slots
        self.max_len = max_len
        self.reserve = reserve
        self.capacity = max_len if reserve else min(initial_capacity, max_len)
        self.plan: StepPlan | None = None
        self._row_index: dict[int, torch.Tensor] = {}
        self._warned = False
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    def warn_unreserved(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "kv cache: the kernel refused to map %d slots x %d positions (strict overcommit?);"
                " the slot cache is allocated whole instead",
                self.num_slots,
                self.max_len,
            )

    def release_tail(self, slot: int, first_position: int) -> None:
        """The slot's positions from `first_position` on hold nothing its sequence wrote (a
        sequence moved in shorter than the one before): return their memory where reserved."""
        for layer in self.slot_layers:
            layer.release_tail(slot, first_position)

    def release(self, first_slot: int, end_slot: int | None = None) -> None:
        """Slots [first_slot, end_slot) hold no sequence: return their memory where the cache is
        reserved (a no-op otherwise). What they held reads as zeros afterwards, except in the
        pages at the range's two ends that they share with a neighbouring slot (stale, finite,
        masked like any position past a sequence's length)."""
        end = self.num_slots if end_slot is None else end_slot
        if first_slot < end:
            for layer in self.slot_layers:
                layer.release(first_slot, end)

    @property
    def slot_layers(self) -> list[SlotLayer]:
        return self.layers  # built from SlotLayer only (transformers' types are not followed: pyproject)

    @property
    def scratch_pos(self) -> int:
        return self.capacity

    def ensure_capacity(self, num_positions: int) -> None:
        """Make room for positions [0, num_positions) before a forward pass writes them."""
        if num_positions <= self.capacity:
            return
        if num_positions > self.max_len:
            raise ValueError(f"position {num_positions - 1} is beyond max_model_len {self.max_len}")
        capacity = min(max(num_positions, 2 * self.capacity), self.max_len)
        for layer in self.slot_layers:
            layer.grow(capacity)
        self.capacity = capacity

    def move(self, src: int, dst: int, num_tokens: int) -> None:
        for layer in self.slot_layers:
            layer.move(src, dst, num_tokens)

    def row_index(self, num_rows: int) -> torch.Tensor:
        # Cached arange per batch size: one fewer tensor allocation per layer per step.
        index = self._row_index.get(num_rows)
        if index is None:
            device = next((la.keys.device for la in self.slot_layers if la.keys is not None), None)
            index = torch.arange(num_rows, device=device)
            self._row_index[num_rows] = index
        return index


def _drop(mapping: mmap.mmap, start: int, stop: int) -> None:
    """MADV_DONTNEED on the pages wholly inside bytes [start, stop) of the mapping."""
    start = -(-start // _PAGE) * _PAGE
    stop = stop // _PAGE * _PAGE
    if stop > start:
        mapping.madvise(mmap.MADV_DONTNEED, start, stop - start)


def reserves(device: torch.device) -> bool:
    """Whether a slot cache on `device` is reserved (memory committed as tokens are written)
    rather than allocated: on the CPU, where an anonymous mapping does that."""
    return device.type == "cpu"


def _reserve(shape: tuple[int, int, int, int], dtype: torch.dtype) -> tuple[torch.Tensor, mmap.mmap] | None:
    """A zero tensor of `shape` in an anonymous private mapping of its own, pages committed on
    first write; None where the kernel refuses the mapping.

    NOTE: no transparent huge pages (MADV_NOHUGEPAGE): a 2 MiB page would commit 128 times the
    memory a token needs, and on the VM measured the first touch of huge pages was slower
    (0.4-0.9 s per 256 MiB against 0.1 s, docs/engine.md)."""
    numel = shape[0] * shape[1] * shape[2] * shape[3]
    try:
        mapping = mmap.mmap(-1, numel * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    except OSError:
        return None
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mapping.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(mapping, dtype=dtype).view(shape), mapping
