"""Sizing the prefix cache at start-up: its bound in blocks, from the model's K/V per block."""

from __future__ import annotations

import logging
from collections.abc import Callable

from models.config import SchedulerConfig
from models.kv.events import KvEvent
from models.kv.prefix_cache import PrefixCache
from models.runner.protocol import Runner
from models.scheduler.sequence import WARM_SCOPE

log = logging.getLogger("surge.engine")


def start_prefix_cache(
    config: SchedulerConfig, runner: Runner, on_events: Callable[[list[KvEvent]], None]
) -> PrefixCache | None:
    """The index, with the runner's pool set up to match; None when caching is off (the flag, a
    model without K/V such as echo, or a bound smaller than one block). Called once the slot
    cache has its tensors, after warmup, so warmup's prompts are not kept. It tells `on_events`
    what it stores and evicts when `config.kv_events` asks."""
    block = config.prefix_cache_block_size
    row_bytes = runner.kv_block_bytes(block) if config.prefix_caching else 0
    if not row_bytes:
        log.info("prefix caching off")
        return None
    full_slots = config.max_num_seqs * config.max_model_len / block * row_bytes
    max_bytes = config.prefix_cache_bytes or int(config.prefix_cache_share * full_slots)
    rows = max_bytes // row_bytes
    if rows < 1:
        log.warning("prefix caching off: %d bytes hold no %d-token block (%d bytes)", max_bytes, block, row_bytes)
        return None
    runner.kv_pool(block, rows)
    log.info("prefix caching on: up to %d blocks of %d tokens, %.1f MiB", rows, block, rows * row_bytes / 2**20)
    return PrefixCache(rows, block, row_bytes, on_events if config.kv_events else None, shared_scope=WARM_SCOPE)
