"""From a validated request to what the route renders, through the app-level traffic layers.

Order, and why:
1. admission: queue bounds, shedding and the degradation level (503s, cheapest first);
2. the tokens bucket: a 429 is charged against the request as degraded (clamped max_tokens);
3. level 3 for the sheddable class: a cached reply, else the canned one, never the model;
4. otherwise the dedup cache: identical deterministic requests share one generation;
5. the result is metered so the unused part of the token reservation is refunded at the end.
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
    reservation = await reserve_tokens(request, prompts, degraded)
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
            source = await state.dedup.run(key, lambda: submit(engine, prompts, degraded, priority))
    except BaseException:
        await reservation.settle(0)
        raise
    return Started(metered(source, reservation, prompts), degraded, degraded_headers(level))


def _canned(
    engine: AsyncEngine, text: str, prompts: Sequence[list[int]], choices: Sequence[SamplingParams]
) -> CannedReply:
    token_ids = engine.tokenizer.hf.encode(text, add_special_tokens=False)
    return CannedReply(text, token_ids, sum(len(p) for p in prompts), len(prompts) * len(choices))
