"""One generation request as the scheduler sees it: token ids and counters, no torch.

A sequence stores counters; everything else is a derived property. Invariants:
- `num_computed_tokens` tokens of the sequence have their K/V in the cache slot `slot`;
- while prefilling, `num_computed_tokens < num_prompt_tokens`;
- while decoding, `num_computed_tokens == num_tokens - 1` (the last sampled token is the next input).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from models.sampling.params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # eos, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"  # the client went away
    ERROR = "error"  # the forward pass or the engine failed: the server's fault
    # The request's own input made it fail (its grammar cannot be compiled or enforced): the
    # client's fault, a 4xx, and no server error in the load signal or the error metrics.
    INVALID = "invalid"
    REJECTED = "rejected"  # dropped before using the model (its queue time ran out)


# The warm templates' cache scope and queue share (app/runtime/warm_templates.py): no API key's
# scope ("" or "key:..."), reused by every scope (models/kv/prefix_cache.py `shared_scope`).
WARM_SCOPE = "\0warm"


def cache_scope_of(share: str) -> str:
    """The cache scope of a queue share: an API key's requests reuse only that key's cached
    prefixes and grammars; without keys there are no tenants to keep apart, and any may reuse any.
    The warm templates' share (no request's: the server submits them at start) is their scope."""
    return share if share.startswith("key:") or share == WARM_SCOPE else ""


@dataclass(eq=False, slots=True)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    # Whose share of the queue it takes (an API key, opaque here): within a priority level the
    # shares' sequences interleave (models/scheduler/fair_shares.py). "" is one share like any other.
    share: str = ""
    # The key's tier (lower = more important): a waiting sequence of a better tier may preempt a
    # running one of a worse tier when the batch is full (models/scheduler/scheduler.py).
    tier: int = 0
    # The end user it is for, within its share (the request's `user`): the share's users interleave.
    user: str = ""
    # Set by the scheduler: the order sequences reached it in, the tie-breaker within a priority level.
    arrival_order: int = 0
    # Set by the engine (its clock, seconds): for queue time, TTFT and the queue deadline.
    arrival_time: float = 0.0
    # Set by the engine when the scheduler first admits it: seconds it waited since arrival_time.
    queue_time: float | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # of the prompt, copied from the prefix cache rather than computed
    slot: int = -1
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    # Output tokens to compute again as if they were prompt (a preempted sequence resumes by
    # prefilling its prompt and what it had generated, then samples its next token).
    num_replayed: int = 0
    num_preemptions: int = 0
    heavy: bool = False  # its lane (models/scheduler/lanes.py), set by the scheduler

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def preempt(self) -> None:
        """Back to the queue, its slot gone: it will compute again its prompt and what it has
        generated, then sample its next token."""
        self.num_replayed = self.num_output_tokens
        self.num_computed_tokens = 0
        self.num_preemptions += 1
        self.status = SequenceStatus.WAITING

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens computed before its next token is sampled: the prompt, plus what it had generated
        when it was preempted."""
        return len(self.prompt_token_ids) + self.num_replayed

    @property
    def prefill_token_ids(self) -> list[int]:
        return (
            self.prompt_token_ids + self.output_token_ids[: self.num_replayed]
            if self.num_replayed
            else self.prompt_token_ids
        )

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prefill_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def cache_scope(self) -> str:
        """Whose cached prefixes (models/kv/prefix_cache.py) and compiled grammars it may reuse."""
        return cache_scope_of(self.share)

    @property
    def prefix_scope(self) -> str:
        """Whose cached prefixes it may reuse and leaves for others: its cache scope, narrowed by
        its `cache_salt` when it has one (never widened: the salt is added to the key's scope)."""
        salt = self.params.cache_salt
        return f"{self.cache_scope}\0salt:{salt}" if salt else self.cache_scope

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]
