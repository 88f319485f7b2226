"""The prefix cache's index: which token blocks have their K/V in the pool, and which go first.

Pure Python, no torch. The scheduler asks it, when a sequence is admitted, for the longest
cached prefix of its prompt, and tells it, when a prompt is computed or a sequence ends, which
blocks to keep; the model runner copies the K/V between a slot and the pool rows this index
hands out (models/kv/pool.py).

A block is `block_size` tokens at a block-aligned position, known by its parent block and its
own tokens: the key `(parent, tokens)`. The dict compares the tokens themselves, so two prompts
share a block only when every token up to its end is the same; no hash collision can hand one
prompt another's K/V (vLLM hashes blocks and moved to SHA-256 for that reason). A chain's root
is its scope: prompts of different scopes (API keys) never share a block, so one tenant's time
to first token never tells it what another has sent.

With `on_events`, every block stored, evicted or cleared is also told as vLLM's KV events
(models/kv/events.py), as it happens, in order: a parent's store before its children's, their
removal before its own.

Eviction is least recently used, and a parent is always touched after its children (a chain is
touched from its last block back to its first), so a block leaves only after every block that
extends it: no chain is ever cut in the middle. A running request never needs a pool row after
admission: its prefix is copied into its own slot then.

Warm templates (the operator's frequent system prompts, prefilled at start) are pinned: never
evicted, at most half the pool. They live in a scope of their own, `shared_scope`, which every
lookup falls back to when its own scope holds less: every tenant reuses the operator's templates,
and no tenant's own blocks ever hang off them (a sequence's blocks are stored in its own scope,
template part included), so nothing a tenant sends reaches another through them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass
from typing import NamedTuple

from models.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, scope_digest

log = logging.getLogger("surge.engine")

Key = tuple[object, tuple[int, ...]]  # (the scope or the parent's uid, the block's tokens)


@dataclass(slots=True)
class _Block:
    uid: int  # never reused: a child's key names it, so a recycled row is never mistaken for its parent
    row: int  # the pool row holding its K/V
    key: Key


class PrefixCacheStats(NamedTuple):
    """Counts since start (tokens, blocks) and the pool's use now (bytes)."""

    queried_tokens: int = 0
    hit_tokens: int = 0
    evicted_blocks: int = 0
    used_bytes: int = 0
    capacity_bytes: int = 0
    pinned_bytes: int = 0  # the warm templates' share of used_bytes


class PrefixCache:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        block_bytes: int = 0,
        on_events: Callable[[list[KvEvent]], None] | None = None,
        shared_scope: str | None = None,
    ) -> None:
        """`shared_scope`: the warm templates' scope, which every lookup may reuse (None: none)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError("a prefix cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_bytes = block_bytes  # K/V bytes of one block, for the figures
        self._by_key: dict[Key, _Block] = {}
        self._lru: OrderedDict[int, _Block] = OrderedDict()  # by uid, least recently used first
        self._pinned: dict[int, _Block] = {}  # by uid: warm templates' blocks, never in _lru
        self._free = list(range(num_blocks - 1, -1, -1))  # low rows first: the pool grows only as used
        self._next_uid = 0
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.evicted_blocks = 0
        self._on_events = on_events
        self.shared_scope = shared_scope

    @property
    def num_cached_blocks(self) -> int:
        return len(self._lru) + len(self._pinned)

    @property
    def num_pinned_blocks(self) -> int:
        return len(self._pinned)

    def stats(self) -> PrefixCacheStats:
        used, capacity = self.num_cached_blocks * self.block_bytes, self.num_blocks * self.block_bytes
        pinned = len(self._pinned) * self.block_bytes
        return PrefixCacheStats(self.queried_tokens, self.hit_tokens, self.evicted_blocks, used, capacity, pinned)

    def _chain(self, scope: str, tokens: Seq[int], num_tokens: int) -> list[_Block]:
        """The cached blocks of tokens[:num_tokens], whole blocks only, first to last."""
        blocks: list[_Block] = []
        parent: object = scope
        size = self.block_size
        for start in range(0, num_tokens - size + 1, size):
            block = self._by_key.get((parent, tuple(tokens[start : start + size])))
            if block is None:
                break
            blocks.append(block)
            parent = block.uid
        return blocks

    def _reusable(self, scope: str, tokens: Seq[int], num_tokens: int) -> list[_Block]:
        """The longer of the scope's own chain and a warm template's."""
        blocks = self._chain(scope, tokens, num_tokens)
        if self._pinned and self.shared_scope is not None and scope != self.shared_scope:
            warm = self._chain(self.shared_scope, tokens, num_tokens)
            return warm if len(warm) > len(blocks) else blocks
        return blocks

    def cached_length(self, scope: str, tokens: Seq[int], limit: int) -> int:
        """Tokens of the longest cached prefix within tokens[:limit], without touching it."""
        return len(self._reusable(scope, tokens, limit)) * self.block_size

    def match(self, scope: str, tokens: Seq[int], limit: int) -> list[int]:
        """Pool rows of the longest cached prefix within tokens[:limit] (whole blocks), marked as
        just used; counts the tokens queried (`limit`) and hit."""
        blocks = self._reusable(scope, tokens, limit)
        self._touch(blocks)
        self.queried_tokens += limit
        self.hit_tokens += len(blocks) * self.block_size
        return [block.row for block in blocks]

    def insert(self, scope: str, tokens: Seq[int], num_tokens: int, pin: bool = False) -> tuple[int, list[int]]:
        """Keep the whole blocks of tokens[:num_tokens]. Returns (first, rows): the blocks from
        index `first` on are new and their K/V must be copied into `rows` of the pool. Makes room
        by evicting the least recently used blocks, never this chain's own; it keeps fewer blocks
        than asked when the pool holds nothing else. `pin`: the new blocks are never evicted,
        while the pinned ones stay within half the pool (past it they are kept as any other)."""
        chain = self._chain(scope, tokens, num_tokens)
        first = len(chain)
        size = self.block_size
        mine = {block.uid for block in chain}
        self._touch(chain)  # before any eviction: the chain's cached part is the newest now
        rows: list[int] = []
        parent: object = chain[-1].uid if chain else scope
        self._evict(num_tokens // size - first - len(self._free), mine)
        for start in range(first * size, num_tokens - size + 1, size):
            if not self._free:  # the pool holds only this chain: keep its start rather than cut it
                break
            row = self._free.pop()
            block = _Block(self._next_uid, row, (parent, tuple(tokens[start : start + size])))
            self._next_uid += 1
            self._by_key[block.key] = block
            mine.add(block.uid)
            chain.append(block)
            rows.append(row)
            parent = block.uid
        self._touch(chain)
        if pin:
            for block in chain[first:]:
                if len(self._pinned) >= self.num_blocks // 2:
                    log.warning("warm templates fill half the prefix cache: the rest of them can be evicted")
                    break
                del self._lru[block.uid]
                self._pinned[block.uid] = block
        if self._on_events is not None and rows:
            self._tell_stored(scope, chain[first:], chain[first - 1].uid if first else None)
        return first, rows

    def _tell_stored(self, scope: str, blocks: list[_Block], parent: int | None) -> None:
        assert self._on_events is not None
        tokens = [token for block in blocks for token in block.key[1]]
        extra: list[tuple[str, ...] | None] | None = None
        if parent is None and scope:  # a scoped chain's root: its scope, as a digest
            extra = [(scope_digest(scope),), *([None] * (len(blocks) - 1))]
        uids = [block.uid for block in blocks]
        self._on_events([BlockStored(uids, parent, tokens, self.block_size, extra)])

    def clear(self) -> None:
        """Forget every block (the pool's contents can no longer be trusted)."""
        self._by_key.clear()
        self._lru.clear()
        self._pinned.clear()  # the templates are no longer warm: their next use computes them again
        self._free = list(range(self.num_blocks - 1, -1, -1))
        if self._on_events is not None:
            self._on_events([AllBlocksCleared()])

    def _evict(self, count: int, keep: set[int]) -> None:
        """Free `count` rows, least recently used blocks first, never one of `keep`. The free rows
        are handed out in ascending order, so a chain's blocks mostly lie in consecutive rows and
        copy as one slice (models/kv/pool.py)."""
        freed: list[int] = []
        removed: list[int] = []
        lru = self._lru
        while len(freed) < count and lru:
            uid, block = next(iter(lru.items()))
            if uid in keep:
                break
            del lru[uid]
            del self._by_key[block.key]
            freed.append(block.row)
            removed.append(uid)
        if removed and self._on_events is not None:
            self._on_events([BlockRemoved(removed)])
        if freed:
            self.evicted_blocks += len(freed)
            self._free = sorted(self._free + freed, reverse=True)

    def _touch(self, chain: list[_Block]) -> None:
        # Last block first, so each parent ends up more recent than its children.
        lru, pinned = self._lru, self._pinned
        for block in reversed(chain):
            if block.uid in pinned:
                continue
            lru[block.uid] = block
            lru.move_to_end(block.uid)
