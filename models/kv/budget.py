"""The K/V's memory budget: how many sequences of max_model_len tokens the slot cache may hold, and
what is left for the prefix cache, from the memory still free once the weights are loaded.

The slot cache (models/kv/cache.py) holds up to max_num_seqs x max_model_len tokens: on a GPU it
grows by doubling, every slot as long as the longest live sequence. A server
whose flags ask for more than the machine holds would start, serve short chats, and die (the
kernel's OOM killer, CUDA's out-of-memory) with every stream it carries the first time enough
long conversations grew the cache. vLLM sizes its cache at start-up from
`--gpu-memory-utilization`; so does surge, from `--kv-cache-memory`:

- a share (the default, 90%): the weights and the K/V together may fill that share of the
  device's memory (on the CPU, of the machine's or the cgroup limit's); the K/V gets what of it
  is still free after loading, and the rest of the memory is left for the forward pass's
  temporaries, the HTTP process and everything else;
- bytes (`8GiB`): the K/V's budget outright;
- 0: no budget; the slots are sized by the flags alone, as asked.

The slots come first: the budget holds some number of sequences at max_model_len (start-up fails
when not even one fits; a client's context limit stays what the model card says). Where the cache
is allocated whole (a GPU), max_num_seqs is lowered to that number and the rest queue. Where it
commits memory only as tokens are written (the CPU's reserved cache), that memory is counted in
tokens instead: every slot stays, and a sequence is admitted while the running ones' prompts plus
max_tokens fit (the scheduler's max_kv_tokens), so short requests run many at once in the memory
a few long ones would take; nothing is preempted, since each is admitted for its whole length. The
prefix cache takes its usual bound (--prefix-cache-size) or what the slots leave, whichever is
smaller.
"""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass, replace

import torch
from transformers import PretrainedConfig

from models.config import SchedulerConfig
from models.kv.memory import Memory, format_bytes

log = logging.getLogger("surge.engine")


def kv_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token takes in the slot cache: every layer, every K/V head."""
    text = config.get_text_config()
    layers = text.num_hidden_layers
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * layers * kv_heads * head_dim * dtype.itemsize


def kv_slack_tokens(config: PretrainedConfig, bytes_per_token: int) -> int:
    """Tokens' worth of memory one sequence may commit beyond its own tokens in a reserved slot
    cache: each (layer, keys or values, K/V head) row of its slot fills its last page in part,
    shares its first with the row before, and has a page for the scratch column (3 pages a row)."""
    text = config.get_text_config()
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    rows = 2 * text.num_hidden_layers * kv_heads
    return -(-3 * mmap.PAGESIZE * rows // bytes_per_token)


@dataclass(frozen=True, slots=True)
class KVBudget:
    bytes: int  # what the slots and the prefix cache together may hold
    reason: str  # how it was reached, for the log and the start-up error


def kv_budget(config: SchedulerConfig, memory: Memory | None) -> KVBudget | None:
    """The budget `config` asks for; None for no budget. `memory`: read after the weights loaded."""
    if config.kv_cache_bytes:
        return KVBudget(config.kv_cache_bytes, f"--kv-cache-memory {format_bytes(config.kv_cache_bytes)}")
    if not config.kv_cache_share or memory is None:
        return None
    # What the share leaves unfilled stays free; the weights already loaded count as filled.
    reserve = memory.total - int(config.kv_cache_share * memory.total)
    free = max(0, memory.free - reserve)
    return KVBudget(
        free,
        f"{config.kv_cache_share:.0%} of {memory.where}'s {format_bytes(memory.total)}, with"
        f" {format_bytes(memory.free)} free after loading the weights",
    )


def fit_kv_budget(
    config: SchedulerConfig, bytes_per_token: int, budget: KVBudget | None, slack_tokens: int = 0
) -> SchedulerConfig:
    """`config` with its slots (max_num_seqs, or max_kv_tokens) and the prefix cache's bound fitted
    to `budget`; raises ValueError when not even one sequence of max_model_len tokens fits.
    `slack_tokens`: for a slot cache that commits memory as tokens are written (kv_slack_tokens);
    0: one allocated whole, whose slots count at full length."""
    if budget is None or bytes_per_token == 0:  # no budget, or a model without K/V (echo)
        return config
    per_sequence = config.max_model_len * bytes_per_token
    fits = budget.bytes // per_sequence
    if fits < 1:
        longest = budget.bytes // bytes_per_token
        if longest < 2:  # not even a one-token prompt and its reply: nothing to lower
            raise ValueError(
                f"the K/V has a budget of {format_bytes(budget.bytes)} ({budget.reason}): not one token's"
                f" {bytes_per_token} bytes fits; give it bytes (--kv-cache-memory 2GiB), a larger share, or free memory"
            )
        raise ValueError(
            f"the K/V of one sequence of max_model_len {config.max_model_len} tokens takes"
            f" {format_bytes(per_sequence)} ({bytes_per_token} bytes a token), more than its budget of"
            f" {format_bytes(budget.bytes)} ({budget.reason});"
            f" lower --max-model-len (at most {longest} fits) or raise --kv-cache-memory"
        )
    seqs = min(config.max_num_seqs, fits)
    slots = seqs * per_sequence
    tokens = slots // bytes_per_token
    # By tokens only where a sequence of max_model_len (and its slack) can still be admitted.
    by_tokens = slack_tokens > 0 and seqs < config.max_num_seqs and tokens >= config.max_model_len + slack_tokens
    if by_tokens:
        log.info(
            "the K/V budget of %s (%s) holds %d tokens, %d sequences at max_model_len %d: all %d slots kept,"
            " sequences admitted while their prompts and max_tokens fit",
            format_bytes(budget.bytes),
            budget.reason,
            tokens,
            fits,
            config.max_model_len,
            config.max_num_seqs,
        )
    elif seqs < config.max_num_seqs:
        log.warning(
            "max_num_seqs lowered from %d to %d: the K/V budget of %s (%s) holds only %d at max_model_len %d"
            " (%s a sequence); lower --max-model-len for more at once",
            config.max_num_seqs,
            seqs,
            format_bytes(budget.bytes),
            budget.reason,
            fits,
            config.max_model_len,
            format_bytes(per_sequence),
        )
    pool = config.prefix_cache_bytes or int(config.prefix_cache_share * slots)
    left = budget.bytes - slots
    if by_tokens:
        fitted = replace(config, max_kv_tokens=tokens, kv_slack_tokens=slack_tokens, kv_cache_bytes=budget.bytes)
    else:
        fitted = replace(config, max_num_seqs=seqs, kv_cache_bytes=budget.bytes)
    if not config.prefix_caching or pool <= left:
        log.info(
            "K/V budget %s (%s): %d slots of %d tokens",
            format_bytes(budget.bytes),
            budget.reason,
            seqs,
            config.max_model_len,
        )
        return replace(fitted, prefix_cache_bytes=pool) if config.prefix_caching else fitted
    log.warning(
        "the prefix cache's bound lowered from %s to %s: what the K/V budget of %s (%s) leaves beside the"
        " slots of %d sequences",
        format_bytes(pool),
        format_bytes(left),
        format_bytes(budget.bytes),
        budget.reason,
        seqs,
    )
    if left <= 0:
        return replace(fitted, prefix_caching=False)
    return replace(fitted, prefix_cache_bytes=left)
