"""The prefix cache's K/V: blocks of tokens copied out of a slot when kept, and into a new
sequence's slot when its prompt starts with them.

Per layer, keys and values in chunks of rows, each (rows, kv_heads, block_size, head_dim),
allocated as the index hands out rows (models/kv/prefix_cache.py) up to its bound; a new chunk
copies nothing (growing one tensor by doubling copied the whole pool each time: 0.15 s of a 20 s
bench round for `m`). A copy rather than a block table: the slot cache stays one contiguous block
per sequence, so the decode step and its attention are unchanged, and copying a block is far
cheaper than computing it (docs/engine.md, prefix caching).

On the CPU a chunk is one anonymous mapping of its own (mmap), not malloc's memory: its pages
are faulted in as rows are first written, so memory follows what is kept rather than the bound,
and the pool stays out of the allocator the forward pass's temporaries and the slot cache come
from. NOTE: with the pool in 2 MiB tensors from malloc, the forward passes of a bench round at a
0% hit rate took 80-100k more page faults than with the cache off, 2-3% of their time; with the
pool in mappings of its own they take as many as with the cache off.
"""

from __future__ import annotations

import math
import mmap

import torch

from models.kv.cache import SlotCache

# Bytes of one chunk, every layer's keys and values together: 1,024 blocks of `m` (64 KiB a block),
# 113 of `l` (576 KiB). Past glibc's largest mmap threshold (32 MiB) too, should one come from malloc.
CHUNK_BYTES = 64 * 2**20


class KVPool:
    def __init__(self, cache: SlotCache, block_size: int, max_rows: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.cache = cache
        self.block_size = block_size
        self.max_rows = max_rows
        self.chunk_rows = max(1, min(max_rows, chunk_bytes // self.block_bytes(cache, block_size)))
        # chunks[c][layer] = (keys, values) of rows [c * chunk_rows, (c + 1) * chunk_rows)
        self.chunks: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

    @staticmethod
    def block_bytes(cache: SlotCache, block_size: int) -> int:
        """K/V bytes of one block, read off the slot cache (after its first forward)."""
        total = 0
        for layer in cache.slot_layers:
            if layer.keys is None or layer.values is None:
                raise RuntimeError("the slot cache is not initialised: run a forward pass first")
            for tensor in (layer.keys, layer.values):
                total += tensor.shape[1] * tensor.shape[3] * tensor.element_size() * block_size
        return total

    @property
    def num_rows(self) -> int:
        return min(len(self.chunks) * self.chunk_rows, self.max_rows)

    def _ensure(self, num_rows: int) -> None:
        while len(self.chunks) * self.chunk_rows < num_rows:
            rows = min(self.chunk_rows, self.max_rows - len(self.chunks) * self.chunk_rows)
            shapes = []
            for layer in self.cache.slot_layers:
                assert layer.keys is not None and layer.values is not None
                shapes += [(rows, t.shape[1], self.block_size, t.shape[3]) for t in (layer.keys, layer.values)]
            first = self.cache.slot_layers[0].keys
            assert first is not None
            flat = _allocate(sum(math.prod(shape) for shape in shapes), first.dtype, first.device)
            parts = flat.split([math.prod(shape) for shape in shapes])
            views = [part.view(shape) for part, shape in zip(parts, shapes, strict=True)]
            self.chunks.append(list(zip(views[0::2], views[1::2], strict=True)))

    @torch.inference_mode()
    def save(self, slot: int, first_block: int, rows: list[int]) -> None:
        """Copy the slot's blocks first_block, first_block + 1, ... into pool `rows`."""
        self._ensure(max(rows) + 1)
        size, n = self.block_size, len(rows)
        start = first_block * size
        runs = _runs(rows, self.chunk_rows)
        for index, layer in enumerate(self.cache.slot_layers):
            assert layer.keys is not None and layer.values is not None
            for kind, src in enumerate((layer.keys, layer.values)):
                blocks = src[slot, :, start : start + n * size].unflatten(1, (n, size))  # (H, n, B, D), a view
                for i, chunk, offset, length in runs:
                    dst = self.chunks[chunk][index][kind]
                    dst[offset : offset + length].copy_(blocks[:, i : i + length].transpose(0, 1))

    @torch.inference_mode()
    def load(self, slot: int, rows: list[int]) -> None:
        """Copy pool `rows` into the slot's positions [0, len(rows) * block_size)."""
        size, n = self.block_size, len(rows)
        self.cache.ensure_capacity(n * size)
        runs = _runs(rows, self.chunk_rows)
        for index, layer in enumerate(self.cache.slot_layers):
            assert layer.keys is not None and layer.values is not None
            for kind, dst in enumerate((layer.keys, layer.values)):
                blocks = dst[slot, :, : n * size].unflatten(1, (n, size))  # (H, n, B, D), a view
                for i, chunk, offset, length in runs:
                    src = self.chunks[chunk][index][kind]
                    blocks[:, i : i + length].copy_(src[offset : offset + length].transpose(0, 1))


def _allocate(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`numel` elements, uninitialised: on the CPU in an anonymous private mapping of their own,
    elsewhere from the device's allocator.

    NOTE: no MADV_HUGEPAGE. On the 2-core VM measured, the first touch of 256 MiB took 0.4-0.9 s
    of system time in transparent huge pages against 0.1 s in 4 KiB pages."""
    if device.type != "cpu":
        return torch.empty(numel, dtype=dtype, device=device)
    mapping = mmap.mmap(-1, numel * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(mapping, dtype=dtype)  # the tensor keeps the mapping alive


def _runs(rows: list[int], chunk_rows: int) -> list[tuple[int, int, int, int]]:
    """(index in rows, chunk, first row in it, length) of each run of consecutive rows within one
    chunk: one slice copy each, about 3x faster than one index_copy_ of them all (an `m`
    prompt's 62 blocks: 16 us a layer against 50)."""
    runs = []
    begin = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] != rows[i - 1] + 1 or rows[i] % chunk_rows == 0:
            chunk, offset = divmod(rows[begin], chunk_rows)
            runs.append((begin, chunk, offset, i - begin))
            begin = i
    return runs
