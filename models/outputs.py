"""What the engine sends back to a request: typed deltas, one message per step at most."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.sampler import TokenLogprob
from models.sequence import FinishReason


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    text: str  # new text since the previous output; never half a character
    token_ids: list[int]  # new tokens since the previous output
    num_prompt_tokens: int
    num_output_tokens: int  # all tokens generated so far
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per new token, when asked for
    finish_reason: FinishReason | None = None
    error: str | None = None  # set with FinishReason.ERROR

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can be served until the process restarts."""


class EngineOverloadedError(RuntimeError):
    """The engine's waiting queue is full."""
