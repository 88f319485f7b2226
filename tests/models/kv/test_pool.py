"""The prefix cache's pool: blocks copied out of a slot and back into another, across chunk
boundaries and from runs of rows in any order."""

from __future__ import annotations

import os

import pytest
import torch

from models.kv.cache import SlotCache
from models.kv.pool import KVPool

HEADS, DIM, BLOCK = 2, 8, 4


def filled_cache() -> SlotCache:
    cache = SlotCache(num_layers=2, num_slots=3, max_len=64, initial_capacity=64)
    for layer in cache.slot_layers:
        layer.lazy_initialization(torch.zeros(1, HEADS, 1, DIM), torch.zeros(1, HEADS, 1, DIM))
        assert layer.keys is not None and layer.values is not None
        layer.keys[0].copy_(torch.randn(HEADS, 65, DIM))
        layer.values[0].copy_(torch.randn(HEADS, 65, DIM))
    return cache


@pytest.mark.parametrize("rows", [[3, 4, 5, 6], [6, 5, 9, 0], [2]])
def test_blocks_saved_from_one_slot_load_into_another_unchanged(rows: list[int]) -> None:
    cache = filled_cache()
    block_bytes = KVPool.block_bytes(cache, BLOCK)
    pool = KVPool(cache, BLOCK, max_rows=10, chunk_bytes=4 * block_bytes)  # [3, 4, 5, 6] crosses a chunk boundary
    assert pool.chunk_rows == 4
    pool.save(0, 1, rows)  # the slot's blocks 1.. (positions 4 onwards)
    assert max(rows) < pool.num_rows <= 10  # chunks as far as the rows used, never past the bound
    pool.load(2, rows)
    n = len(rows) * BLOCK
    for layer in cache.slot_layers:
        assert layer.keys is not None and layer.values is not None
        assert torch.equal(layer.keys[2, :, :n], layer.keys[0, :, BLOCK : BLOCK + n])
        assert torch.equal(layer.values[2, :, :n], layer.values[0, :, BLOCK : BLOCK + n])


def test_block_bytes_count_every_layer_key_and_value() -> None:
    assert KVPool.block_bytes(filled_cache(), BLOCK) == 2 * 2 * HEADS * BLOCK * DIM * 4


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc")
def test_memory_follows_the_rows_written_not_the_chunk() -> None:
    cache = filled_cache()
    block_bytes = KVPool.block_bytes(cache, BLOCK)
    pool = KVPool(cache, BLOCK, max_rows=1 << 20, chunk_bytes=256 * 2**20)
    assert pool.chunk_rows * block_bytes == 256 * 2**20
    before = rss_bytes()
    pool.save(0, 0, [0, 1])  # a 256 MiB chunk, two of its rows written
    assert len(pool.chunks) == 1
    assert rss_bytes() - before < 32 * 2**20
    pool.load(1, [0, 1])
    for layer in cache.slot_layers:
        assert layer.keys is not None
        assert torch.equal(layer.keys[1, :, : 2 * BLOCK], layer.keys[0, :, : 2 * BLOCK])
