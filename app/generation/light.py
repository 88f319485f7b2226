"""The light model as a degradation level: under load, simple requests go to a small model rather
than waiting for the big one, or getting a canned reply.

A request is given the light model (`--light-model`, one of the served chat models) when:
- the model it asked for is at `--light-model-level` or past it for the request's tier (its own
  degradation levels: middleware/admission/degradation.py), and the light model is not;
- its key's tier is at least `--light-model-min-tier` (tier 0, the most important, may be kept on
  the model it asked for);
- it is simple: at most `--light-model-max-prompt-tokens` prompt tokens, as the asked-for model
  counts them, and a `max_tokens` of at most `--light-model-max-tokens` (left out, it is capped at
  that on the light model).
The route then renders the request again with the light model's tokenizer and template (the two
may differ) and the reply names the light model: its `model` field, and the `x-surge-model`
header that every generation response carries (app/generation/pipeline.py). A request the light
model does not take goes on to the asked-for model's own layers: degraded parameters, a canned
reply at level 3, shedding at level 4.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from app.runtime.served import ServedModel
from app.runtime.state import ServerState
from models import AsyncEngine


@dataclass(frozen=True, slots=True)
class LightRoute:
    served: ServedModel
    max_tokens: int  # the request's max_tokens on the light model


def light_route(
    request: Request, state: ServerState, engine: AsyncEngine, num_prompt_tokens: int, max_tokens: int | None
) -> LightRoute | None:
    """Where the request should go instead of `engine`'s model, or None: it stays."""
    settings = state.settings
    light = state.models.get(settings.light_model) if settings.light_model else None
    if light is None or light.engine is engine:
        return None
    tier: int = request.scope.get("state", {}).get("priority_tier", 0)
    cap = settings.light_model_max_tokens
    if (
        tier < settings.light_model_min_tier
        or num_prompt_tokens > settings.light_model_max_prompt_tokens
        or (max_tokens is not None and max_tokens > cap)
    ):
        return None
    level = settings.light_model_level
    if state.served(engine).admission.levels.level(tier) < level or light.admission.levels.level(tier) >= level:
        return None
    state.light_routed[state.served(engine).name] += 1
    return LightRoute(light, cap if max_tokens is None else max_tokens)
