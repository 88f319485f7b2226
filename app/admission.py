"""Admission control and the per-request effect of the degradation level.

Runs after a request is parsed and tokenized, before it reaches the engine, so every refusal
is a fast 503 with Retry-After before any stream opens:
- the waiting queue is bounded in requests and in prompt tokens;
- level 4 sheds requests whose priority is at or below the shedding cut (lowest first);
- level 2 and up rejects prompts over a limit and clamps max_tokens; level 1 and up drops
  logprobs. Level 3 (cached or canned replies) is the route's business: it needs the dedup cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from app.degradation import DegradationConfig, Degrader, load_score
from app.errors import OpenAIError, service_unavailable
from models.sampling_params import SamplingParams

if TYPE_CHECKING:  # app.settings imports this module, and `surge serve` must not wait on torch there
    from models.async_engine import AsyncEngine

DEGRADED_HEADER = "x-surge-degraded"
DEFAULT_CANNED_REPLY = "The service is very busy right now. Please try again in a little while."


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    max_queued_requests: int = 256  # 0 = no bound
    max_queued_tokens: int = 0  # prompt tokens waiting; 0 = no bound
    degraded_max_tokens: int = 256  # level >= 2
    degraded_max_prompt_tokens: int = 2048  # level >= 2
    canned_reply: str = DEFAULT_CANNED_REPLY
    # Level 4 sheds requests whose priority is >= this (priority: lower runs first).
    shed_priority: int = 0

    def __post_init__(self) -> None:
        if self.max_queued_requests < 0 or self.max_queued_tokens < 0:
            raise ValueError("queue bounds must be 0 (no bound) or positive")
        if self.degraded_max_tokens < 1 or self.degraded_max_prompt_tokens < 1:
            raise ValueError("degraded limits must be positive")


class Admission:
    def __init__(
        self,
        config: AdmissionConfig,
        degrader: Degrader,
        queue: Callable[[], tuple[int, int]],
        retry_after: Callable[[], float],
    ) -> None:
        """`queue()` gives (waiting requests, waiting prompt tokens); `retry_after()` a hint in s."""
        self.config = config
        self.degrader = degrader
        self._queue = queue
        self._retry_after = retry_after
        self.num_shed = 0
        self.num_queue_full = 0

    def admit(self, num_prompt_tokens: int, priority: int) -> int:
        """The degradation level for this request, or a 503 raised before anything runs."""
        config = self.config
        self.check_queue()
        _, num_waiting_tokens = self._queue()
        if config.max_queued_tokens and num_waiting_tokens + num_prompt_tokens > config.max_queued_tokens:
            self.num_queue_full += 1
            raise self._busy("The server is at capacity: too many prompt tokens are already waiting.")
        level = self.degrader.level()
        if level >= 4 and priority >= config.shed_priority:
            self.num_shed += 1
            raise self._busy("The server is overloaded and is shedding low-priority requests.")
        if level >= 2 and num_prompt_tokens > config.degraded_max_prompt_tokens:
            self.num_shed += 1
            raise self._busy(
                f"The server is overloaded: prompts over {config.degraded_max_prompt_tokens} tokens "
                "are not accepted until load falls."
            )
        return level

    def degrade(self, choices: Sequence[SamplingParams], level: int) -> list[SamplingParams]:
        if level < 1:
            return list(choices)
        out = []
        for params in choices:
            if params.logprobs is not None:
                params = replace(params, logprobs=None)
            if level >= 2 and params.max_tokens > self.config.degraded_max_tokens:
                params = replace(params, max_tokens=self.config.degraded_max_tokens)
            out.append(params)
        return out

    def check_queue(self) -> None:
        """The bound on waiting requests alone: cheap enough to check before a body is read."""
        num_waiting, _ = self._queue()
        if self.config.max_queued_requests and num_waiting >= self.config.max_queued_requests:
            self.num_queue_full += 1
            raise self._busy(f"The server is at capacity: {num_waiting} requests are already waiting.")

    def _busy(self, message: str) -> OpenAIError:
        return service_unavailable(message, max(1.0, math.ceil(self._retry_after())))


def build_admission(
    degradation: DegradationConfig,
    config: AdmissionConfig,
    engine: AsyncEngine,
    num_held: Callable[[], int] = lambda: 0,
) -> Admission:
    """Admission wired to a running engine's queue and load figures.

    `num_held()`: requests past admission not yet submitted to the engine (app/pipeline.py).
    They wait for a slot as much as the engine's queue does, so they count against its bound:
    a greedy request waits a loop turn for its dedup flight to submit it, and a burst admitted
    in that turn used to overshoot --max-queued-requests."""
    core = engine.core
    degrader = Degrader(degradation, lambda: load_score(engine.load_snapshot(), degradation))
    return Admission(
        config,
        degrader,
        queue=lambda: (core.num_waiting + num_held(), core.num_waiting_tokens),
        retry_after=lambda: engine.load_snapshot().queue_time_p90,
    )
