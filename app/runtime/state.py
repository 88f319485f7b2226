"""What the lifespan owns and routes reach: settings and the engine, behind small dependencies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request

from app.config.settings import Settings
from app.response_format import Constraints
from app.runtime.background import BackgroundRuns
from app.runtime.connections import Connections
from app.runtime.request_budget import MAX_BODY_BYTES, RequestBudget
from app.runtime.response_storage import ResponseStorage
from app.runtime.response_store import ResponseStore, StoreLimits
from app.runtime.served import ServedModel, check_model
from middleware.admission.admission import Admission
from middleware.dedup.cache import DedupCache
from middleware.dedup.similar import SimilarQueries
from middleware.edge.auth_failures import AuthFailures
from middleware.errors import OpenAIError, service_unavailable
from middleware.generation import key_share_of
from middleware.idempotency.asgi import IdempotencyCounts
from middleware.key_ring import KeyRing, KeySet
from middleware.rate_limit.buckets import TokenBuckets
from middleware.rate_limit.concurrency import ConcurrencyCounts
from middleware.rate_limit.limits import RateLimitCounts
from middleware.redis import RedisBackend
from models import AsyncEngine, Embedder, GrammarCompiler

B = TypeVar("B")

# Seconds a client should wait before retrying while the model loads or the engine is down.
RETRY_AFTER_SECONDS = 5.0


@dataclass(slots=True)
class ServerState:
    settings: Settings
    # The accepted API keys in force (none: auth off); a reload of the keys file replaces its set.
    keys: KeyRing = field(default_factory=lambda: KeyRing(KeySet()))
    engine: AsyncEngine | None = None
    # The encoder of /v1/embeddings (--embedding-model), once loaded; None when none is served.
    embeddings: Embedder | None = None
    redis: RedisBackend | None = None  # set when --redis-url is given: the rate-limit buckets
    # Idempotency keys and dedup results: --redis-cache-url's Redis, else the same as `redis`.
    redis_cache: RedisBackend | None = None
    rate_limits: TokenBuckets | None = None  # set when a rate limit is on
    admission: Admission | None = None  # set with the engine
    # Off (ttl 0) until create_app sets the configured one, so routes never branch on it.
    dedup: DedupCache = field(default_factory=lambda: DedupCache(ttl=0))
    # Recent queries' embeddings for similar-query merging (middleware/dedup/similar.py), kept as dedup's results are.
    similar: SimilarQueries = field(default_factory=lambda: SimilarQueries(ttl=0))
    # Counted by the middleware, read by app/ops/metrics.py.
    rate_limit_counts: RateLimitCounts = field(default_factory=RateLimitCounts)
    idempotency_counts: IdempotencyCounts = field(default_factory=IdempotencyCounts)
    concurrency_counts: ConcurrencyCounts = field(default_factory=ConcurrencyCounts)
    # Failed authentications, throttled per client address; the door's auth layer counts them.
    auth_failures: AuthFailures = field(default_factory=lambda: AuthFailures(0))
    # The server's open connections (app/server/http_protocol.py reports them; app/ops/metrics.py reads).
    connections: Connections = field(default_factory=lambda: Connections(0, 0))
    # Requests with a grammar, by kind (app/response_format.py counts them, app/ops/metrics.py reads).
    constrained_requests: Counter[str] = field(default_factory=Counter)
    # The Responses API's stored responses, per API key; create_app sizes it from the settings.
    responses: ResponseStorage = field(default_factory=lambda: ResponseStorage(ResponseStore(StoreLimits())))
    # The Responses API's `background: true` runs going on in this process.
    background: BackgroundRuns = field(default_factory=BackgroundRuns)
    # Every chat model served, by its name in the API, the main one (`engine`) first; set once all
    # have loaded (app/runtime/served.py).
    models: dict[str, ServedModel] = field(default_factory=dict)
    # Requests given the light model under load, by the model they asked for (app/generation/light.py).
    light_routed: Counter[str] = field(default_factory=Counter)
    load_error: BaseException | None = None
    is_shutting_down: bool = False

    @property
    def redis_backends(self) -> list[RedisBackend]:
        """Each Redis connection once (the cache's is the buckets' unless --redis-cache-url differs)."""
        if self.redis_cache is None or self.redis_cache is self.redis:
            return [self.redis] if self.redis is not None else []
        return [self.redis, self.redis_cache] if self.redis is not None else [self.redis_cache]

    @property
    def num_held(self) -> int:
        """Requests past admission that are not yet submitted to the engine."""
        return self.admission.num_held if self.admission is not None else 0

    @property
    def is_ready(self) -> bool:
        """Every served model loaded (the chat engine warm, the encoder too where one is served)."""
        embeddings_ready = self.embeddings is not None or not self.settings.embedding_model
        models_ready = bool(self.models) and all(served.engine.is_ready for served in self.models.values())
        return self.engine is not None and models_ready and embeddings_ready and not self.is_shutting_down

    def served(self, engine: AsyncEngine) -> ServedModel:
        """The served model whose engine `engine` is (what a route picked by the request's `model`)."""
        return next(served for served in self.models.values() if served.engine is engine)

    def body_limit(self) -> int:
        """The default body limit (--max-body-bytes 0): what a request within the served model's
        work budget needs; its largest until the model has loaded (every request gets a 503 then)."""
        if self.engine is None:
            return MAX_BODY_BYTES
        return RequestBudget.of(self.settings, self.engine.config.scheduler.max_model_len).body_bytes

    def constraints(self, request: Request, compiler: GrammarCompiler) -> Constraints:
        """What the request's grammars are built and checked with (app/response_format.py)."""
        closed = self.settings.json_schema_objects == "closed"
        return Constraints.of(request, compiler, closed, self.constrained_requests)

    def not_ready_error(self) -> OpenAIError:
        if self.is_shutting_down:
            return service_unavailable("The server is shutting down.", RETRY_AFTER_SECONDS)
        if self.engine is None or (self.settings.embedding_model and self.embeddings is None):
            return service_unavailable("The model is still loading.", RETRY_AFTER_SECONDS)
        return service_unavailable("The engine is not running.", RETRY_AFTER_SECONDS)


# NOTE: dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a
# thread pool, a thread hop per request for what is an attribute read.
async def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.surge
    return state


async def get_engine(request: Request, model: str | None = None) -> AsyncEngine:
    """The engine of the chat model `model` names (the main one for None), or the request's refusal:
    a 404 for an unknown model (a 400 for the embedding model), else a 503 (with Retry-After) while
    the models load, after an engine died, or at shutdown."""
    state: ServerState = request.app.state.surge
    name = state.settings.model_name if model is None else state.settings.chat_model_named(model)
    if name is None:
        check_model(state.settings, str(model))  # raises: unknown, or the embedding model
    if not state.is_ready or state.engine is None:
        raise state.not_ready_error()
    return state.models[str(name)].engine


async def refuse_when_queue_full(request: Request) -> None:
    """A 503 before the body is read, parsed or tokenized when the queue is already full: under
    overload most requests are refused, and a refusal must cost next to nothing (and come fast).
    Admission checks the bound again, with the prompt's tokens, once the request is parsed."""
    admission = request.app.state.surge.admission
    if admission is not None:
        admission.check_queue(1, key_share_of(request.scope))


async def generation_inputs(
    request: Request, parse_body: Callable[[Request], Awaitable[B]]
) -> tuple[B, ServerState, AsyncEngine]:
    """The parsed body, the server state and the engine of a generation route, in the order its
    refusals come: a full queue before the body is read, a bad body (400) before the engine's
    readiness (503) is asked.

    NOTE: plain calls rather than FastAPI dependencies: solving four `Depends` per request was a
    fifth of the HTTP process's CPU per request (docs/engine.md, measurements)."""
    await refuse_when_queue_full(request)
    return await render_inputs(request, parse_body)


async def render_inputs(
    request: Request, parse_body: Callable[[Request], Awaitable[B]]
) -> tuple[B, ServerState, AsyncEngine]:
    """As `generation_inputs`, for routes that only render or tokenize (nothing reaches the engine's
    queue, so a full queue does not refuse them: a router tokenizes every request it routes)."""
    body = await parse_body(request)
    state: ServerState = request.app.state.surge
    # A RootModel body (/tokenize's two forms) holds the request in `root`.
    model = getattr(getattr(body, "root", body), "model", None)
    return body, state, await get_engine(request, model)
