"""From a validated request to what the route renders: the after-parse layers, then the engine.

The layers and their order are middleware's (middleware/__init__.py, `AFTER_PARSE`); this module
builds them once the engine is up, wires them to it (its queue and load figures, its tokenizer for
the canned reply) and puts the submission to the engine innermost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastapi import Request

from app.config.settings import Settings
from app.generation.similar import query_embedder
from app.runtime.state import RETRY_AFTER_SECONDS, ServerState
from middleware import AFTER_PARSE
from middleware.admission.admission import DEGRADED_HEADER, Admission, AdmissionLayer
from middleware.admission.canned import DegradedReplyLayer
from middleware.admission.degradation import TierLevels, load_score
from middleware.admission.priority import check_priority, engine_priority
from middleware.dedup.cache import DedupLayer
from middleware.dedup.similar import MergeSimilarLayer
from middleware.errors import service_unavailable
from middleware.generation import Generation, GenerationLayer, Handler, SimilarQuery, chain
from middleware.rate_limit.concurrency import ConcurrencyLayer
from middleware.rate_limit.tokens import TokenLayer
from models import AsyncEngine, OutputSource, SamplingParams

# Which served model answered (its name; the body's `model` says it too): a request may be given
# the light model under load (app/generation/light.py).
MODEL_HEADER = "x-surge-model"
# An end user's name is kept to this many characters: it is only a key for the queue's fairness.
MAX_USER_CHARS = 256

log = logging.getLogger("surge.pipeline")


@dataclass(frozen=True, slots=True)
class Started:
    source: OutputSource
    choice_params: list[SamplingParams]  # as degraded
    headers: dict[str, str]


async def start_generation(
    request: Request,
    state: ServerState,
    engine: AsyncEngine,
    prompts: Sequence[list[int]],
    choice_params: Sequence[SamplingParams],
    priority: int,
    endpoint: str,
    user: str | None = None,
    similar: Callable[[], SimilarQuery | None] | None = None,
) -> Started:
    """Run the after-parse layers of `engine`'s model on one request: the source to render, the
    sampling parameters of its choices as degraded, and the response headers (the model that
    answers; the degradation level, when one applied)."""
    served = state.served(engine)
    key_state = request.scope.get("state", {})
    check_priority(priority, key_state.get("min_priority", 0))
    tier = key_state.get("priority_tier", 0)
    params = list(choice_params)
    header = state.settings.user_header
    named = request.headers.get(header) if header else None
    generation = Generation(
        request.scope, request.headers, endpoint, prompts, params, engine_priority(tier, priority), tier
    )
    generation.user = (named or user or "")[:MAX_USER_CHARS]
    generation.similar = similar
    source = await served.pipeline(generation)
    headers = {MODEL_HEADER: served.name, **degraded_headers(generation.level)}
    return Started(source, generation.choice_params, headers)


def degraded_headers(level: int) -> dict[str, str]:
    """The level applied to a response, in a header: the OpenAI body shape never changes."""
    return {DEGRADED_HEADER: str(level)} if level else {}


def build_pipeline(
    settings: Settings, state: ServerState, engine: AsyncEngine, model: str
) -> tuple[Handler, Admission]:
    """The after-parse layers in `AFTER_PARSE` order around the submission to `engine`, serving
    `model` (its name in the API), and their admission (its queue bounds and degradation levels)."""
    core = engine.core
    degradation = settings.degradation
    tiers = {0, *(settings.keys.priority_tiers().values() if settings.keys is not None else ())}
    admission = Admission(
        settings.admission,
        TierLevels(degradation, lambda tier: load_score(engine.load_snapshot(tier), degradation), tiers=tiers),
        queue=lambda: (core.num_waiting, core.num_waiting_tokens),
        retry_after=lambda: engine.load_snapshot().queue_time_p90,
        queue_of=engine.load.num_waiting_of,
    )
    canned = settings.admission.canned_reply
    layers: dict[str, GenerationLayer] = {
        "concurrency_sequences": ConcurrencyLayer(),
        "admission": AdmissionLayer(admission),
        "rate_limit_tokens": TokenLayer(),
        "degraded_reply": DegradedReplyLayer(
            state.dedup,
            model=model,
            shed_priority=settings.admission.shed_priority,
            text=canned,
            token_ids=engine.tokenizer.hf.encode(canned, add_special_tokens=False),
            shed=admission.shed,
        ),
        "merge_similar": MergeSimilarLayer(
            state.dedup, state.similar, query_embedder(state), model=model, default=settings.merge_similar
        ),
        "dedup": DedupLayer(state.dedup, model=model),
    }

    async def submit(generation: Generation) -> OutputSource:
        """len(prompts) x len(choice_params) sequences; choice index = prompt_index * n + choice."""
        generation.release_hold()
        sequences = [(prompt, params) for prompt in generation.prompts for params in generation.choice_params]
        try:
            return engine.submit(
                sequences,
                priority=generation.priority,
                share=generation.share,
                tier=generation.tier,
                user=generation.user,
            )
        except RuntimeError as exc:
            log.warning("submit failed: %r", exc)  # the text is for the log, not the client
            raise service_unavailable("The engine is not available.", RETRY_AFTER_SECONDS) from exc

    if set(layers) != set(AFTER_PARSE):
        raise RuntimeError(f"after-parse layers {sorted(layers)} do not match middleware.AFTER_PARSE {AFTER_PARSE}")
    return chain([layers[name] for name in AFTER_PARSE], submit), admission
