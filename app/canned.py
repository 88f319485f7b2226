"""Level-3 replies: a fixed text served in place of a generation, shaped like an engine result.

It quacks like a `RequestGroup` (ids, index, `next_outputs`, `async with`), so the routes
render it through the same JSON and SSE code as a real generation, and the OpenAI body shape
never changes; only the `x-surge-degraded` header tells the client.
"""

from __future__ import annotations

from types import TracebackType

from models.outputs import RequestOutput
from models.sequence import FinishReason


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
