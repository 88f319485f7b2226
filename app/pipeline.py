"""From a validated request to what the route renders, through the app-level traffic layers.

Order, and why:
1. admission: queue bounds, shedding and the degradation level (503s, cheapest first);
2. the tokens bucket: a 429 is charged against the request as degraded (clamped max_tokens);
3. level 3 for the sheddable class: a cached reply, else the canned one, never the model;
4. otherwise the dedup cache: identical deterministic requests share one generation;
5. the result is metered so the unused part of the token reservation is refunded at the end.

From admission until the request is submitted to the engine (or settled without it: a dedup
hit, a canned reply, a refusal) it is *held* here, counted in `state.num_held`: metrics add
it to the engine's queue, since it is load the engine has not seen yet (a Redis round trip
for the tokens bucket or the dedup lock can take a while).
NOTE: a dedup creator that waits for another replica's result stops counting once its stream
opens, as a follower does: it will not add work to this engine unless that wait gives up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import Request

from app.canned import CannedReply
from app.generation import admit, degraded_headers, submit
from app.output_source import OutputSource
from app.rate_limits import metered, reserve_tokens
from app.state import ServerState
from models.async_engine import AsyncEngine
from models.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class Started:
    source: OutputSource
    choices: list[SamplingParams]  # as degraded
    headers: dict[str, str]


async def start_generation(
    request: Request,
    state: ServerState,
    engine: AsyncEngine,
    prompts: Sequence[list[int]],
    choices: Sequence[SamplingParams],
    priority: int,
    endpoint: str,
) -> Started:
    # A keys-file tier is the base priority of everything the key sends.
    priority += int(request.scope.get("state", {}).get("priority_tier", 0))
    level, degraded = admit(state, sum(len(prompt) for prompt in prompts), priority, choices)
    held = _Held(state)
    try:
        reservation = await reserve_tokens(request, prompts, degraded)
    except BaseException:
        held.release()
        raise

    def start() -> OutputSource:
        held.release()
        return submit(engine, prompts, degraded, priority)

    try:
        key = state.dedup.fingerprint(
            request.headers, model=state.settings.model_name, endpoint=endpoint, prompts=prompts, choices=degraded
        )
        settings = state.settings.admission
        source: OutputSource
        if level >= 3 and priority >= settings.shed_priority:
            source = (state.dedup.lookup(key) if key else None) or _canned(
                engine, settings.canned_reply, prompts, degraded
            )
        else:
            source = await state.dedup.run(key, start)
    except BaseException:
        await reservation.settle(0)
        raise
    finally:
        held.release()
    return Started(metered(source, reservation, prompts), degraded, degraded_headers(level))


class _Held:
    """One request in `state.num_held` until `release()` (idempotent)."""

    __slots__ = ("_state",)

    def __init__(self, state: ServerState) -> None:
        self._state: ServerState | None = state
        state.num_held += 1

    def release(self) -> None:
        if self._state is not None:
            self._state.num_held -= 1
            self._state = None


def _canned(
    engine: AsyncEngine, text: str, prompts: Sequence[list[int]], choices: Sequence[SamplingParams]
) -> CannedReply:
    token_ids = engine.tokenizer.hf.encode(text, add_special_tokens=False)
    return CannedReply(text, token_ids, sum(len(p) for p in prompts), len(prompts) * len(choices))
