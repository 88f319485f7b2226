"""Admission control and the per-request effect of the degradation level.

Runs after a request is parsed and tokenized, before it reaches the engine, so every refusal
is a fast 503 with Retry-After before any stream opens:
- the waiting queue is bounded in sequences and in prompt tokens, and one API key holds at most
  its share of it (`max_queue_share_per_key`), so another key always finds room;
- the level is the request's tier's (middleware/admission/degradation.py `TierLevels`);
- level 4 sheds requests whose key's tier is at or past the shedding cut (the least important);
- level 2 and up rejects prompts over a limit and clamps max_tokens; level 1 and up drops
  logprobs. Level 3 (cached or canned replies) is its own layer (middleware/admission/canned.py):
  it needs the dedup cache.

From admission until the request is submitted to the engine (or settled without it: a dedup hit, a
canned reply, a refusal) it is *held*, counted in `num_held`: the queue bound counts it, and
metrics add it to the engine's queue, since it is load the engine has not seen yet (a Redis round
trip for the tokens bucket or the dedup lock can take a while). A greedy request waits a loop turn
for its dedup flight to submit it, and a burst admitted in that turn used to overshoot
--max-queued-requests.
NOTE: a dedup creator that waits for another replica's result stops counting once its stream
opens, as a follower does: it will not add work to this engine unless that wait gives up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from middleware.admission.degradation import TierLevels
from middleware.errors import OpenAIError, service_unavailable
from middleware.generation import Generation, Handler
from models import OutputSource, SamplingParams

DEGRADED_HEADER = "x-surge-degraded"
DEFAULT_CANNED_REPLY = "The service is very busy right now. Please try again in a little while."


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    max_queued_requests: int = 256  # 0 = no bound
    max_queued_tokens: int = 0  # prompt tokens waiting; 0 = no bound
    degraded_max_tokens: int = 256  # level >= 2
    degraded_max_prompt_tokens: int = 2048  # level >= 2
    canned_reply: str = DEFAULT_CANNED_REPLY
    # Level 4 sheds requests of tiers >= this (tier: lower = more important; 0 without one).
    shed_priority: int = 0
    # The most of max_queued_requests one API key's sequences may hold (1 = no share). Half: however
    # hard one key pushes, another key finds half the queue for it; a key with nothing waiting may
    # still add one request within the bound, so no request is too large to ever be admitted.
    max_queue_share_per_key: float = 0.5

    def __post_init__(self) -> None:
        if self.max_queued_requests < 0 or self.max_queued_tokens < 0:
            raise ValueError("queue bounds must be 0 (no bound) or positive")
        if not 0 < self.max_queue_share_per_key <= 1:
            raise ValueError("max_queue_share_per_key must be above 0 and at most 1")
        if self.degraded_max_tokens < 1 or self.degraded_max_prompt_tokens < 1:
            raise ValueError("degraded limits must be positive")


class Admission:
    def __init__(
        self,
        config: AdmissionConfig,
        levels: TierLevels,
        queue: Callable[[], tuple[int, int]],
        retry_after: Callable[[], float],
        queue_of: Callable[[str], int] = lambda key: 0,
    ) -> None:
        """`queue()` gives the engine's (waiting sequences, waiting prompt tokens); `queue_of(key)`
        the waiting sequences of one key's share; `retry_after()` a hint in seconds."""
        self.config = config
        self.levels = levels
        self._queue = queue
        self._queue_of = queue_of
        self._retry_after = retry_after
        self.num_shed = 0
        self.num_queue_full = 0
        self.num_over_share = 0  # 429s: a key past its share of the queue
        self.num_held = 0  # past admission, not yet submitted to the engine
        self._held_by_key: dict[str, int] = {}

    def hold(self, num_sequences: int = 1, key: str | None = None) -> Callable[[], None]:
        """Count a request's sequences as held (for `key`'s share too, when it has one) until the
        returned function is called (once or more)."""
        self.num_held += num_sequences
        if key is not None:
            self._held_by_key[key] = self._held_by_key.get(key, 0) + num_sequences
        is_held = True

        def release() -> None:
            nonlocal is_held
            if is_held:
                is_held = False
                self.num_held -= num_sequences
                if key is not None:
                    left = self._held_by_key[key] - num_sequences
                    if left:
                        self._held_by_key[key] = left
                    else:
                        del self._held_by_key[key]

        return release

    def admit(self, num_prompt_tokens: int, tier: int, num_sequences: int = 1, key: str | None = None) -> int:
        """The degradation level for this request, or a 503 (429 past its key's share) raised before
        anything runs. `key`: the request's share of the queue when it has an API key."""
        config = self.config
        self.check_queue(num_sequences, key)
        _, num_waiting_tokens = self._queue()
        if config.max_queued_tokens and num_waiting_tokens + num_prompt_tokens > config.max_queued_tokens:
            self.num_queue_full += 1
            raise self._busy("The server is at capacity: too many prompt tokens are already waiting.")
        level = self.levels.level(tier)
        if level >= 4 and tier >= config.shed_priority:
            self.num_shed += 1
            raise self._busy("The server is overloaded and is shedding low-priority requests.")
        if level >= 2 and num_prompt_tokens > config.degraded_max_prompt_tokens:
            self.num_shed += 1
            raise self._busy(
                f"The server is overloaded: prompts over {config.degraded_max_prompt_tokens} tokens "
                "are not accepted until load falls."
            )
        return level

    def degrade(self, choice_params: Sequence[SamplingParams], level: int) -> list[SamplingParams]:
        if level < 1:
            return list(choice_params)
        out = []
        for params in choice_params:
            if params.logprobs is not None:
                params = replace(params, logprobs=None)
            if level >= 2 and params.max_tokens > self.config.degraded_max_tokens:
                params = replace(params, max_tokens=self.config.degraded_max_tokens)
            out.append(params)
        return out

    def check_queue(self, num_sequences: int = 1, key: str | None = None) -> None:
        """The bound on waiting sequences (each choice of each prompt is one): before a body is
        read, a request counts one; after parsing, all of its sequences. An empty queue takes any
        request (at most MAX_SEQUENCES, app/openai/limits.py), so none waits forever for room.
        Then `key`'s share of the bound: a 429, since it is that key's own volume that is refused."""
        num_waiting = self._queue()[0] + self.num_held
        bound = self.config.max_queued_requests
        adds = "" if num_sequences == 1 else f" and this request adds {num_sequences}"
        if bound and num_waiting and num_waiting + num_sequences > bound:
            self.num_queue_full += 1
            raise self._busy(f"The server is at capacity: {num_waiting} requests are already waiting{adds}.")
        share = self.config.max_queue_share_per_key
        if not bound or share >= 1 or key is None:
            return
        num_of_key = self._queue_of(key) + self._held_by_key.get(key, 0)
        limit = max(1, math.floor(share * bound))
        if num_of_key and num_of_key + num_sequences > limit:
            self.num_over_share += 1
            retry_after = max(1.0, math.ceil(self._retry_after()))
            raise OpenAIError(
                f"This API key already has {num_of_key} sequences waiting{adds}; its share of the queue is "
                f"{limit} of {bound}. Retry when some of them have started.",
                status_code=429,
                type="requests",
                code="rate_limit_exceeded",
                headers={"retry-after": str(int(retry_after))},
            )

    def shed(self, message: str) -> OpenAIError:
        """A 503 for a request some later layer sheds (counted with the shed ones); raise it."""
        self.num_shed += 1
        return self._busy(message)

    def _busy(self, message: str) -> OpenAIError:
        return service_unavailable(message, max(1.0, math.ceil(self._retry_after())))


class AdmissionLayer:
    """Admit (or refuse) the request, degrade its choices' parameters to the level, and hold it until it is
    submitted or settled."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    async def __call__(self, generation: Generation, call_next: Handler) -> OutputSource:
        admission = self.admission
        num_sequences, key = generation.num_sequences, generation.key_share
        generation.level = admission.admit(generation.num_prompt_tokens, generation.tier, num_sequences, key)
        generation.choice_params = admission.degrade(generation.choice_params, generation.level)
        generation.release_hold = release = admission.hold(num_sequences, key)
        try:
            return await call_next(generation)
        finally:
            release()
