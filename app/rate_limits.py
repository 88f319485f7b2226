"""The app's side of rate limits: a request's token cost, reserved once it is known.

The requests bucket and the response headers live in `middleware/rate_limit.py`; only the app
knows a request's token cost (prompt tokens + max_tokens of every sequence, the most its usage
can report), so routes reserve it here after validation and before the engine sees the request.
Over the caller's tokens-per-minute limit that is a 429 of type `tokens`.

The reservation is settled by `metered`, which wraps the output source a route renders: it
counts the tokens handed out and, when the route leaves the source's `async with` (finished,
failed, or the client went away), refunds what was reserved but not used.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from fastapi import Request

from app.errors import OpenAIError
from app.output_source import OutputSource
from middleware.rate_limit import RateLimitExceeded, TokenReservation
from middleware.rate_limit import reserve_tokens as reserve_in_bucket
from models.outputs import RequestOutput
from models.sampling_params import SamplingParams


async def reserve_tokens(
    request: Request, prompts: Sequence[Sequence[int]], choices: Sequence[SamplingParams]
) -> TokenReservation:
    """Reserve prompt tokens + max_tokens of each of len(prompts) x len(choices) sequences."""
    cost = sum(len(prompt) for prompt in prompts) + len(prompts) * sum(params.max_tokens for params in choices)
    try:
        return await reserve_in_bucket(request.scope, cost)
    except RateLimitExceeded as exc:
        raise OpenAIError(
            exc.message, status_code=429, type=exc.kind, code="rate_limit_exceeded", headers=exc.headers
        ) from None


def metered(source: OutputSource, reservation: TokenReservation, prompts: Sequence[Sequence[int]]) -> OutputSource:
    """`source`, settling `reservation` with the tokens used when its `async with` ends."""
    if not reservation.is_refundable:
        return source
    return _MeteredSource(source, reservation, sum(len(prompt) for prompt in prompts))


class _MeteredSource:
    def __init__(self, source: OutputSource, reservation: TokenReservation, num_prompt_tokens: int) -> None:
        self._source = source
        self._reservation = reservation
        self.request_ids = source.request_ids
        self.index = source.index
        self.num_used_tokens = num_prompt_tokens  # as usage counts them: prompts once, then every new token

    @property
    def finished(self) -> bool:
        return self._source.finished

    async def next_outputs(self, timeout: float | None = None) -> list[RequestOutput]:
        outputs = await self._source.next_outputs(timeout)
        for output in outputs:
            self.num_used_tokens += len(output.token_ids)
        return outputs

    async def __aenter__(self) -> _MeteredSource:
        await self._source.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self._source.__aexit__(exc_type, exc, tb)
        finally:
            await self._reservation.settle(self.num_used_tokens)
