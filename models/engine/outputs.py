"""What the engine sends back to a request: typed deltas, one message per step at most, and the
protocol of anything that yields them.

Value types only, no torch: the traffic layers (middleware/) store, replay and stand in for
outputs without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from models.sampling.logprobs import TokenLogprob
from models.scheduler.sequence import FinishReason, Sequence


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
    num_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    # On a sequence's first token only: seconds it waited in the engine's queue (the server's load
    # figures take one per request from it: models/load/requests.py).
    queue_time: float | None = None
    # What ended the sequence when it was not the model's end token (vLLM's `stop_reason`): the stop
    # string that matched, or a stop token id from `stop_token_ids`; None otherwise.
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def error_output(seq: Sequence, message: str, reason: FinishReason = FinishReason.ERROR) -> RequestOutput:
    """The last output of a sequence that ends without a token: an error, or dropped unrun."""
    return RequestOutput(seq.request_id, "", [], seq.num_prompt_tokens, seq.num_output_tokens, [], reason, message)


class OutputSource(Protocol):
    """What the routes render: the engine's `RequestGroup`, a shared (dedup) generation, a canned
    reply, or a metered wrapper of any of them. One protocol, so each layer can wrap another.

    Iterate with `next_outputs` until `finished`; leaving `async with` ends it (for an engine
    request, that aborts what has not finished)."""

    request_ids: list[str]
    index: dict[str, int]

    @property
    def finished(self) -> bool: ...

    async def next_outputs(self, timeout: float | None = None) -> list[RequestOutput]: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


# What clients are told of an engine failure; the exception itself is logged where it happened.
MODEL_FAILED = "the model failed on this batch"
ENGINE_STOPPED = "the engine stopped"


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can be served until the process restarts."""
