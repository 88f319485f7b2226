"""The prefix cache's block events, as vLLM publishes its KV-cache events: what a router's index
of "which replica holds which prefix" is built from (the server publishes them: app/ops/kv_events.py).

- `BlockStored`: blocks newly cached, one chain's run of them: their hashes, the hash of the block
  before the first (None at a chain's root), the tokens of all of them in order, the block size,
  and per block its extra keys (the root block of a scoped chain carries a digest of its scope,
  as vLLM puts a request's `cache_salt` in its first block's);
- `BlockRemoved`: blocks evicted;
- `AllBlocksCleared`: the whole cache forgotten (after an engine failure).

A block's "hash" is its uid in the cache: unique and never reused while the server runs, a parent
always stored before its children and removed after them. The tokens are what a consumer hashes
for itself (vLLM's hash function and seed are its own); the uid is how it learns which of its
entries a removal names. A scope's digest, never the scope: a scope holds an API key.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple


class BlockStored(NamedTuple):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    extra_keys: list[tuple[str, ...] | None] | None = None


class BlockRemoved(NamedTuple):
    block_hashes: list[int]


class AllBlocksCleared(NamedTuple):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


def scope_digest(scope: str) -> str:
    """What an event may say of a chain's scope (an API key's, a salt's): a digest, 16 hex digits."""
    return hashlib.sha256(scope.encode()).hexdigest()[:16]
