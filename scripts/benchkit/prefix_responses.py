"""The `responses-chain` workload (`python -m scripts.bench --workload responses-chain`): the
conversations of `multi-turn`, over the Responses API the way agents hold them: each turn sends
only its new user turn and `previous_response_id` (the server keeps the history), with the system
prompt as `instructions` on every turn (the openai Agents SDK's way; OpenAI does not carry
instructions from one turn to the next). Turn 1 is a cold prefill; turns 2+ start with turn 1's
prompt and reply, so the prefix cache serves them: `ttft_p50_later_s` against `ttft_p50_first_s`.

Only a server that stores responses can run it (surge; llama-server and `transformers serve`
answer `/v1/responses` without `previous_response_id`). TTFT runs to the first
`response.output_text.delta`; usage comes from the last event's Response.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from scripts.benchkit.load import REQUEST_TIMEOUT_S, StatusError, SystemUnderTest, sse_events
from scripts.benchkit.rawhttp import RawHttpClient, RawHttpError
from scripts.benchkit.turns import TurnResult

PATH = "/v1/responses"
FINAL_EVENTS = ("response.completed", "response.incomplete")


async def stream_response_turn(client: RawHttpClient, body: dict[str, Any], headers: dict[str, str]) -> TurnResult:
    """One streamed Response: its figures, and the `response_id` the next turn continues from."""
    first: float | None = None
    num_deltas, response = 0, None
    start = time.perf_counter()
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            async for event in sse_events(client, PATH, body, headers):
                kind = event.get("type")
                if kind == "response.output_text.delta" and event.get("delta"):
                    first = first if first is not None else time.perf_counter()
                    num_deltas += 1
                elif kind in FINAL_EVENTS:
                    response = event["response"]
                elif kind in ("response.failed", "error"):
                    return TurnResult(error=f"stream error: {json.dumps(event)[:200]}")
    except StatusError as exc:
        return TurnResult(error=str(exc))
    except (RawHttpError, json.JSONDecodeError, TimeoutError) as exc:
        return TurnResult(error=f"{type(exc).__name__}: {exc}")
    e2e = time.perf_counter() - start
    if response is None or first is None:
        return TurnResult(error=f"incomplete stream: {num_deltas} text deltas, final Response: {response is not None}")
    usage = response.get("usage") or {}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    output_tokens = int(usage.get("output_tokens", num_deltas))
    ttft = first - start
    return TurnResult(1, None, ttft, e2e, usage.get("input_tokens"), cached, output_tokens, response_id=response["id"])


def chains(
    sut: SystemUnderTest,
    client: RawHttpClient,
    conversations: Sequence[tuple[str, Sequence[str]]],
    max_tokens: int,
    stagger_s: float,
    on_done: Callable[[], None] | None,
) -> list[Coroutine[Any, Any, list[TurnResult]]]:
    """One coroutine per conversation (its system prompt, its user turns): the turns in order, each
    continuing the one before."""
    body = {"model": sut.model_name, "max_output_tokens": max_tokens, "temperature": 0, "stream": True}
    body |= sut.request_extras

    async def send(request: dict[str, Any], turn: int) -> TurnResult:
        result = await stream_response_turn(client, {**body, **request}, sut.request_headers())
        result.turn = turn
        if on_done is not None:
            on_done()
        return result

    async def converse(index: int, system: str, users: Sequence[str]) -> list[TurnResult]:
        await asyncio.sleep(index * stagger_s)
        results: list[TurnResult] = []
        previous: str | None = None
        num_turns = len(users)
        for turn, user in enumerate(users):
            request: dict[str, Any] = {"instructions": system, "input": user}
            if previous is not None:
                request["previous_response_id"] = previous
            results.append(await send(request, turn + 1))
            if results[-1].error is not None:
                skipped = range(turn + 2, num_turns + 1)
                return results + [TurnResult(turn=t, error="skipped: an earlier turn failed") for t in skipped]
            previous = results[-1].response_id
        return results

    return [converse(i, system, users) for i, (system, users) in enumerate(conversations)]
