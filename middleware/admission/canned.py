"""Level-3 replies: at degradation level 3, a request of the sheddable class gets a reply that
costs no generation: a cached one (a live flight or a result kept by the dedup cache), else a fixed
text, never the model. A request that asks for a format (a JSON schema, JSON mode) gets a cached
reply or a 503: the fixed text would not match its format, and a client that parses the reply
would take it for one that did.

`CannedReply` quacks like a `RequestGroup` (ids, index, `next_outputs`, `async with`), so the routes
render it through the same JSON and SSE code as a real generation, and the OpenAI body shape never
changes; only the `x-surge-degraded` header tells the client.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType

from middleware.dedup.cache import DedupCache
from middleware.errors import OpenAIError
from middleware.generation import Generation, Handler
from models import FinishReason, OutputSource, RequestOutput


class DegradedReplyLayer:
    """Level 3, for requests of tiers at or past the shedding cut: a cached reply or the canned one."""

    def __init__(
        self,
        dedup: DedupCache,
        *,
        model: str,
        shed_priority: int,
        text: str,
        token_ids: Sequence[int],
        shed: Callable[[str], OpenAIError],
    ) -> None:
        """shed: the 503 for a request no reply here can serve (Admission.shed)."""
        self.dedup = dedup
        self.shed = shed
        self.model = model
        self.shed_priority = shed_priority
        self.text = text
        self.token_ids = list(token_ids)  # the canned text, tokenized once

    async def __call__(self, generation: Generation, call_next: Handler) -> OutputSource:
        if generation.level < 3 or generation.tier < self.shed_priority:
            return await call_next(generation)
        key = self.dedup.key_of(generation, model=self.model)
        cached = self.dedup.lookup(key) if key else None
        if cached is not None:
            return cached
        if any(params.grammar is not None for params in generation.choice_params):
            raise self.shed("The server is overloaded: replies in a requested format are paused until load falls.")
        return CannedReply(self.text, self.token_ids, generation.num_prompt_tokens, generation.num_sequences)


class CannedReply:
    def __init__(self, text: str, token_ids: list[int], num_prompt_tokens: int, num_choices: int) -> None:
        self.request_ids = [f"canned-{i}" for i in range(num_choices)]
        self.index = {request_id: i for i, request_id in enumerate(self.request_ids)}
        self._outputs = [
            RequestOutput(request_id, text, list(token_ids), num_prompt_tokens, len(token_ids), [], FinishReason.STOP)
            for request_id in self.request_ids
        ]

    @property
    def finished(self) -> bool:
        return not self._outputs

    async def next_outputs(self, timeout: float | None = None) -> list[RequestOutput]:
        outputs, self._outputs = self._outputs, []
        return outputs

    def close(self) -> None:
        self._outputs = []

    async def __aenter__(self) -> CannedReply:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __aiter__(self) -> CannedReply:
        return self

    async def __anext__(self) -> RequestOutput:
        if not self._outputs:
            raise StopAsyncIteration
        return self._outputs.pop(0)
