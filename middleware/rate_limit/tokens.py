"""The tokens bucket, after parse: a request's token cost reserved once it is known, refunded in part
when it ends.

Only the app knows a request's token cost (prompt tokens + max_tokens of every sequence, the most
its usage can report), so `TokenLayer` reserves it after validation and before the engine sees the
request. Over the caller's tokens-per-minute limit that is a 429 of type `tokens`. The reservation
is settled by `metered`, which wraps the output source a route renders: it counts the tokens
handed out and, when the route leaves the source's `async with` (finished, failed, or the client
went away), refunds what was reserved but not used.
"""

from __future__ import annotations

from types import TracebackType

from starlette.types import Scope

from middleware.errors import OpenAIError
from middleware.generation import Generation, Handler
from middleware.rate_limit.limits import RateLimitExceeded, RequestLimits, TokenReservation
from models import OutputSource, RequestOutput


class TokenLayer:
    """Reserve the request's tokens, meter what the route hands out, refund the rest at the end."""

    async def __call__(self, generation: Generation, call_next: Handler) -> OutputSource:
        reservation = await reserve_tokens(generation.scope, token_cost(generation))
        try:
            source = await call_next(generation)
        except BaseException:
            await reservation.settle(0)
            raise
        return metered(source, reservation, generation.num_prompt_tokens)


def token_cost(generation: Generation) -> int:
    """Prompt tokens + max_tokens of each of len(prompts) x len(choice_params) sequences."""
    max_tokens = sum(params.max_tokens for params in generation.choice_params)
    return generation.num_prompt_tokens + len(generation.prompts) * max_tokens


def request_limits(scope: Scope) -> RequestLimits | None:
    limits: RequestLimits | None = scope.get("state", {}).get("rate_limits")
    return limits


async def reserve_tokens(scope: Scope, cost: int) -> TokenReservation:
    """Reserve `cost` tokens for this request (a no-op when its caller has no token limit); over the
    limit, OpenAI's 429."""
    limits = request_limits(scope)
    if limits is None:
        return TokenReservation(cost)
    try:
        return await limits.reserve_tokens(cost)
    except RateLimitExceeded as exc:
        raise OpenAIError(
            exc.message, status_code=429, type=exc.kind, code="rate_limit_exceeded", headers=exc.headers
        ) from None


def metered(source: OutputSource, reservation: TokenReservation, num_prompt_tokens: int) -> OutputSource:
    """`source`, settling `reservation` with the tokens used when its `async with` ends."""
    if not reservation.is_refundable:
        return source
    return _MeteredSource(source, reservation, num_prompt_tokens)


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
