"""A whole non-streamed response: the engine's outputs gathered per choice, while the client is watched.

Streaming responses notice a disconnect on their own (app/generation/sse.py); a plain JSON response would go
on generating for nobody, holding a slot, so `unless_disconnected` watches the connection meanwhile
and cancels the work (which aborts its engine requests) when the client leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request
from starlette.requests import ClientDisconnect

from app.runtime.state import RETRY_AFTER_SECONDS
from middleware.errors import invalid_request, server_error, service_unavailable
from models import FinishReason, OutputSource, RequestOutput, TokenLogprob

T = TypeVar("T")


@dataclass(slots=True)
class ChoiceResult:
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    stop_reason: str | int | None = None  # the stop string or token that ended it (vLLM's)


async def collect(source: OutputSource) -> list[ChoiceResult]:
    """Gather a whole non-streamed response; an engine error becomes a 500 (or 503)."""
    results = [ChoiceResult() for _ in source.request_ids]
    async with source:
        while not source.finished:
            for output in await source.next_outputs():
                result = results[source.index[output.request_id]]
                raise_if_failed(output)
                result.text.append(output.text)
                result.token_ids += output.token_ids
                result.logprobs += output.logprobs
                result.finish_reason = output.finish_reason
                result.num_prompt_tokens = output.num_prompt_tokens
                result.num_cached_tokens = output.num_cached_tokens
                result.stop_reason = output.stop_reason
    return results


def raise_if_failed(output: RequestOutput) -> None:
    if output.error is None:
        return
    if output.finish_reason is FinishReason.REJECTED:  # dropped unrun: retrying later can work
        raise service_unavailable(f"The server is overloaded: {output.error}.", RETRY_AFTER_SECONDS)
    if output.finish_reason is FinishReason.INVALID:  # the request's own input: a 400, not our error
        raise invalid_request(f"{output.error[:1].upper()}{output.error[1:]}.")
    raise server_error(f"The server had an error while generating: {output.error}")


class ClientDisconnected(ClientDisconnect):
    """The client closed the connection before the response was ready: answered, as a client gone
    while its body was read, with a 499 by app/server/errors.py."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run `work`, cancelling it (and so aborting its engine requests) if the client leaves.

    Streaming responses notice a disconnect on their own; a plain JSON response would go on
    generating for nobody, holding a slot, so this watches the connection meanwhile.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            # Let the work's cleanup (abort, refunds) finish before the handler returns.
            await asyncio.wait({task})
    if task.cancelled():
        raise ClientDisconnected
    return task.result()


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
