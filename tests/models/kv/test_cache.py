"""The slot cache's reserved memory on the CPU (models/kv/cache.py): pages are committed where
tokens are written and nowhere else, and a release hands a range of slots back (they read as zeros
again) without touching a neighbour's row. Memory is read from the mappings' own resident pages."""

from __future__ import annotations

import mmap

import pytest
import torch

from models.kv.cache import SlotCache, SlotLayer

MIB = 2**20
SLOTS, HEADS, MAX_LEN, DIM = 8, 4, 8192, 64  # a slot: 4 x 8,193 x 64 float32 = 8 MiB a tensor


def committed(*tensors: torch.Tensor) -> int:
    """Resident bytes of the mappings holding `tensors` (/proc/self/smaps): what the kernel has
    committed there, whatever the rest of the process allocates meanwhile. A mapping the kernel
    merged with a neighbour counts the neighbour too, the same before and after."""
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors]
    total, overlaps = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                overlaps = any(start < stop and begin < end for begin, stop in spans)
            elif head == "Rss:" and overlaps:
                total += int(line.split()[1]) * 1024
    return total


def reserved_layer() -> tuple[SlotCache, SlotLayer]:
    cache = SlotCache(num_layers=1, num_slots=SLOTS, max_len=MAX_LEN, reserve=True)
    layer = cache.slot_layers[0]
    sample = torch.zeros(1, HEADS, 1, DIM)
    layer.lazy_initialization(sample, sample)
    return cache, layer


def test_a_reserved_cache_commits_only_what_is_written() -> None:
    cache, layer = reserved_layer()
    assert layer.keys is not None and layer.values is not None
    assert cache.capacity == MAX_LEN and layer.keys.shape == (SLOTS, HEADS, MAX_LEN + 1, DIM)
    full = 2 * layer.keys.numel() * 4  # 128 MiB of keys and values reserved
    before = committed(layer.keys, layer.values)
    assert not bool(layer.keys.any())  # never written: zeros (the shared zero page, not memory)
    assert committed(layer.keys, layer.values) - before < MIB
    layer.keys[2:4] = 1.0
    layer.values[2:4] = 1.0
    written = 4 * HEADS * (MAX_LEN + 1) * DIM * 4  # two slots of keys and values: 32 MiB
    grown = committed(layer.keys, layer.values) - before
    assert written <= grown < written + MIB < full


def test_release_returns_the_slots_memory_and_keeps_their_neighbours() -> None:
    cache, layer = reserved_layer()
    assert layer.keys is not None and layer.values is not None
    layer.keys.fill_(1.0)
    layer.values.fill_(2.0)
    before = committed(layer.keys, layer.values)
    cache.release(3, 6)
    freed = before - committed(layer.keys, layer.values)
    slot = HEADS * (MAX_LEN + 1) * DIM * 4
    assert 6 * slot - 4 * 4096 <= freed <= 6 * slot  # 3 slots of keys and values, less 2 edge pages each
    assert not bool(layer.keys[4].any()) and not bool(layer.values[4].any())
    # Only pages wholly inside the range go: slot 3 starts and slot 5 ends mid-page (a slot is
    # 2,048.25 pages), and those two pages keep their data, as do the neighbours on either side.
    for tensor, value in ((layer.keys, 1.0), (layer.values, 2.0)):
        assert bool((tensor[2] == value).all()) and bool((tensor[6] == value).all())
        assert 0 < int((tensor[3] == value).sum()) <= 1024 and 0 < int((tensor[5] == value).sum()) <= 1024
    cache.release(0)  # to the end, from a page boundary
    assert not bool(layer.keys[:7].any()) and not bool(layer.values[:7].any())


def test_an_unreserved_cache_grows_by_doubling_and_release_keeps_its_data() -> None:
    cache = SlotCache(num_layers=1, num_slots=2, max_len=64, initial_capacity=8)
    layer = cache.slot_layers[0]
    sample = torch.zeros(1, HEADS, 1, DIM)
    layer.lazy_initialization(sample, sample)
    assert layer.keys is not None and layer.keys.shape[2] == 9
    layer.keys.fill_(1.0)
    cache.ensure_capacity(20)
    assert cache.capacity == 20 and layer.keys.shape[2] == 21
    assert bool((layer.keys[:, :, :8] == 1.0).all())  # what was there is copied across
    cache.release(0)  # a no-op: allocator memory is not handed back piecemeal
    assert bool((layer.keys[:, :, :8] == 1.0).all())


def test_release_tail_drops_a_slots_positions_past_a_length_in_every_head() -> None:
    cache, layer = reserved_layer()
    assert layer.keys is not None and layer.values is not None
    layer.keys.fill_(1.0)
    layer.values.fill_(1.0)
    before = committed(layer.keys, layer.values)
    cache.release_tail(5, 1000)  # a sequence of 1,000 tokens moved into slot 5
    freed = before - committed(layer.keys, layer.values)
    tail = HEADS * (MAX_LEN + 1 - 1000) * DIM * 4  # each head's positions 1,000 on, keys and values
    assert 2 * tail - 2 * HEADS * 2 * 4096 <= freed <= 2 * tail
    for tensor in (layer.keys, layer.values):
        assert bool((tensor[5, :, :1000] == 1.0).all())  # what the sequence holds stays
        # The rest reads as zeros: whole pages only, so from the next page on, up to the page a
        # row shares with the next head's.
        assert not bool(tensor[5, :, 1016 : MAX_LEN - 16].any())
        assert bool((tensor[4] == 1.0).all()) and bool((tensor[6] == 1.0).all())


def test_where_the_kernel_refuses_the_mapping_the_cache_is_allocated_whole(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Strict overcommit (vm.overcommit_memory=2) refuses a reservation past the commit limit.
    def refuse(*args: object, **kwargs: object) -> mmap.mmap:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    cache = SlotCache(num_layers=2, num_slots=2, max_len=64, reserve=True)
    sample = torch.zeros(1, HEADS, 1, DIM)
    with caplog.at_level("WARNING", logger="surge.engine"):
        for layer in cache.slot_layers:
            layer.lazy_initialization(sample, sample)
    warnings = [r.message for r in caplog.records if "refused to map 2 slots x 64 positions" in r.message]
    assert len(warnings) == 1  # once for the cache, not per layer
    for layer in cache.slot_layers:
        assert layer.keys is not None and layer.keys.shape == (2, HEADS, 65, DIM) and not bool(layer.keys.any())
    cache.release(0)  # a no-op on allocated memory
    cache.release_tail(0, 3)
