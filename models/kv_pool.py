"""The prefix cache's K/V: blocks of tokens copied out of a slot when kept, and into a new
sequence's slot when its prompt starts with them.

Per layer, keys and values in chunks of CHUNK_ROWS rows, each (rows, kv_heads, block_size,
head_dim), allocated as the index hands out rows (models/prefix_cache.py) up to its bound, so
memory follows what is kept rather than the bound; a new chunk copies nothing (growing one
tensor by doubling copied the whole pool each time: 0.15 s of a 20 s bench round for `m`). A
copy rather than a block table: the slot cache stays one contiguous block per sequence, so the
decode step and its attention are unchanged, and copying a block is far cheaper than computing
it (docs/engine.md, prefix caching).
"""

from __future__ import annotations

import torch

from models.kv_cache import SlotCache

CHUNK_ROWS = 256  # blocks per chunk: 16 MiB over all layers for `m` (64 KiB a block), 144 MiB for `l`


class KVPool:
    def __init__(self, cache: SlotCache, block_size: int, max_rows: int) -> None:
        self.cache = cache
        self.block_size = block_size
        self.max_rows = max_rows
        # chunks[c][layer] = (keys, values) of rows [c * CHUNK_ROWS, (c + 1) * CHUNK_ROWS)
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
        return min(len(self.chunks) * CHUNK_ROWS, self.max_rows)

    def _ensure(self, num_rows: int) -> None:
        while len(self.chunks) * CHUNK_ROWS < num_rows:
            rows = min(CHUNK_ROWS, self.max_rows - len(self.chunks) * CHUNK_ROWS)
            chunk = []
            for layer in self.cache.slot_layers:
                assert layer.keys is not None and layer.values is not None
                keys, values = (
                    torch.empty((rows, t.shape[1], self.block_size, t.shape[3]), dtype=t.dtype, device=t.device)
                    for t in (layer.keys, layer.values)
                )
                chunk.append((keys, values))
            self.chunks.append(chunk)

    @torch.inference_mode()
    def save(self, slot: int, first_block: int, rows: list[int]) -> None:
        """Copy the slot's blocks first_block, first_block + 1, ... into pool `rows`."""
        self._ensure(max(rows) + 1)
        size, n = self.block_size, len(rows)
        start = first_block * size
        runs = _runs(rows)
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
        runs = _runs(rows)
        for index, layer in enumerate(self.cache.slot_layers):
            assert layer.keys is not None and layer.values is not None
            for kind, dst in enumerate((layer.keys, layer.values)):
                blocks = dst[slot, :, : n * size].unflatten(1, (n, size))  # (H, n, B, D), a view
                for i, chunk, offset, length in runs:
                    src = self.chunks[chunk][index][kind]
                    blocks[:, i : i + length].copy_(src[offset : offset + length].transpose(0, 1))


def _runs(rows: list[int]) -> list[tuple[int, int, int, int]]:
    """(index in rows, chunk, first row in it, length) of each run of consecutive rows within one
    chunk: one slice copy each, about 3x faster than one index_copy_ of them all (an `m`
    prompt's 62 blocks: 16 us a layer against 50)."""
    runs = []
    begin = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] != rows[i - 1] + 1 or rows[i] % CHUNK_ROWS == 0:
            chunk, offset = divmod(rows[begin], CHUNK_ROWS)
            runs.append((begin, chunk, offset, i - begin))
            begin = i
    return runs
