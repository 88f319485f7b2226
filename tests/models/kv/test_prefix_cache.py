"""The prefix cache's index: exact whole-block matches per scope, least recently used eviction
that never cuts a chain in the middle, and a bound it never passes."""

from __future__ import annotations

import pytest

from models.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, scope_digest
from models.kv.prefix_cache import PrefixCache
from models.scheduler.sequence import WARM_SCOPE


def test_a_prompt_matches_its_longest_cached_prefix_in_whole_blocks() -> None:
    cache = PrefixCache(num_blocks=16, block_size=4)
    prompt = list(range(100, 114))  # 14 tokens: three whole blocks
    assert cache.insert("", prompt, len(prompt)) == (0, [0, 1, 2])
    assert cache.match("", [*prompt, 7, 7], 16) == [0, 1, 2]
    assert cache.match("", prompt, 13) == [0, 1, 2]
    assert cache.match("", prompt, 11) == [0, 1]  # the limit cuts the third block
    other = [*prompt[:5], 0, *prompt[6:]]  # one token differs inside the second block
    assert cache.match("", other, 14) == [0]
    assert (cache.queried_tokens, cache.hit_tokens) == (16 + 13 + 11 + 14, 12 + 12 + 8 + 4)


def test_scopes_never_share_a_block() -> None:
    cache = PrefixCache(num_blocks=16, block_size=4)
    prompt = list(range(8))
    cache.insert("key:a", prompt, 8)
    assert cache.match("key:b", prompt, 8) == []
    assert cache.match("", prompt, 8) == []
    assert cache.match("key:a", prompt, 8) == [0, 1]


def test_inserting_again_copies_only_the_new_blocks() -> None:
    cache = PrefixCache(num_blocks=16, block_size=4)
    turn1 = list(range(10))
    assert cache.insert("", turn1, 10) == (0, [0, 1])
    assert cache.insert("", turn1, 10) == (2, [])
    turn2 = [*turn1, 50, 51, 52, 53, 54, 55]  # the reply and the next turn extend the chain
    assert cache.insert("", turn2, 16) == (2, [2, 3])
    assert cache.num_cached_blocks == 4


def test_eviction_takes_the_least_recently_used_leaves_first() -> None:
    cache = PrefixCache(num_blocks=4, block_size=2)
    shared = [1, 1, 2, 2]
    cache.insert("", [*shared, 3, 3], 6)  # rows 0, 1, 2
    cache.insert("", [9, 9], 2)  # row 3: the pool is full
    cache.match("", [*shared, 3, 3], 6)  # the chain is the newest now; [9, 9] the oldest
    first, rows = cache.insert("", [*shared, 4, 4], 6)
    assert (first, rows) == (2, [3])  # [9, 9] made room
    assert cache.match("", [9, 9], 2) == []
    # The next one evicts the oldest leaf, [3, 3], never the shared start under it.
    assert cache.insert("", [8, 8], 2) == (0, [2])
    assert cache.match("", [*shared, 3, 3], 6) == [0, 1]
    assert cache.match("", [*shared, 4, 4], 6) == [0, 1, 3]
    assert cache.evicted_blocks == 2


def test_a_chain_longer_than_the_pool_keeps_its_start() -> None:
    cache = PrefixCache(num_blocks=3, block_size=2, block_bytes=10)
    long = list(range(20))
    assert cache.insert("", long, 20) == (0, [0, 1, 2])
    assert cache.match("", long, 20) == [0, 1, 2]
    assert cache.stats().used_bytes == cache.stats().capacity_bytes == 30


def test_clear_forgets_everything() -> None:
    cache = PrefixCache(num_blocks=4, block_size=2)
    cache.insert("", [1, 2, 3, 4], 4)
    cache.clear()
    assert cache.match("", [1, 2, 3, 4], 4) == []
    assert cache.insert("", [1, 2, 3, 4], 4) == (0, [0, 1])


def test_a_pool_needs_a_block() -> None:
    with pytest.raises(ValueError):
        PrefixCache(num_blocks=0, block_size=16)


def test_events_tell_every_store_eviction_and_clear_in_order() -> None:
    told: list[KvEvent] = []
    cache = PrefixCache(num_blocks=3, block_size=2, on_events=told.extend)
    cache.insert("key:a", [1, 2, 3, 4, 5], 5)  # two whole blocks
    cache.insert("key:a", [1, 2, 3, 4, 6, 7], 6)  # shares both, adds one
    cache.insert("", [9, 9, 8, 8], 4)  # unscoped: two more, one evicted first
    cache.clear()
    stored_a, stored_b, removed, stored_c, cleared = told
    assert stored_a == BlockStored([0, 1], None, [1, 2, 3, 4], 2, [(scope_digest("key:a"),), None])
    assert stored_b == BlockStored([2], 1, [6, 7], 2, None)
    assert removed == BlockRemoved([2, 1])  # least recently used first, a child before its parent
    assert stored_c == BlockStored([3, 4], None, [9, 9, 8, 8], 2, None)  # no scope, no extra keys
    assert isinstance(cleared, AllBlocksCleared)
    assert "key:a" not in repr(told)  # a scope is told only as its digest


def test_no_events_are_kept_without_a_listener() -> None:
    cache = PrefixCache(num_blocks=2, block_size=2)
    cache.insert("", [1, 2, 3, 4], 4)
    assert cache.num_cached_blocks == 2


def test_warm_templates_are_pinned_shared_by_every_scope_and_capped_at_half_the_pool() -> None:
    cache = PrefixCache(num_blocks=8, block_size=4, shared_scope=WARM_SCOPE)
    template = list(range(100, 120))  # 5 blocks: only 4 may be pinned
    assert cache.insert(WARM_SCOPE, template, 20, pin=True) == (0, [0, 1, 2, 3, 4])
    assert cache.num_pinned_blocks == 4 and cache.num_cached_blocks == 5
    assert cache.stats().pinned_bytes == 0  # no block size in bytes given
    for scope in ("", "key:a", "key:b"):
        assert cache.match(scope, [*template[:16], 1, 2, 3, 4], 20) == [0, 1, 2, 3]
    for i in range(6):  # other prompts fill the pool and evict each other, and the unpinned fifth block
        cache.insert("key:a", list(range(1000 * i, 1000 * i + 8)), 8)
    assert cache.match("key:b", template, 20) == [0, 1, 2, 3]
    assert cache.evicted_blocks > 0


def test_a_scopes_own_continuation_of_a_template_stays_its_own() -> None:
    """A tenant's blocks never hang off the shared template chain: its continuation is stored
    under its own scope (the template's tokens copied there too), so no other scope reaches it."""
    cache = PrefixCache(num_blocks=16, block_size=4, shared_scope=WARM_SCOPE)
    template = list(range(100, 108))
    cache.insert(WARM_SCOPE, template, 8, pin=True)
    conversation = [*template, 7, 7, 7, 7, 8, 8, 8, 8]
    assert cache.match("key:a", conversation, 16) == [0, 1]  # the template's rows
    first, rows = cache.insert("key:a", conversation, 16)
    assert (first, len(rows)) == (0, 4)  # all of it, in key:a's own scope
    assert len(cache.match("key:a", conversation, 16)) == 4
    assert cache.match("key:b", conversation, 16) == [0, 1]


def test_clearing_unpins() -> None:
    cache = PrefixCache(num_blocks=8, block_size=4, shared_scope=WARM_SCOPE)
    cache.insert(WARM_SCOPE, list(range(8)), 8, pin=True)
    cache.clear()
    assert cache.num_pinned_blocks == cache.num_cached_blocks == 0
    assert cache.match("", list(range(8)), 8) == []
