"""The app factory and the process: lifespan, middleware order, uvicorn.

The lifespan owns every long-lived object. The model loads in the background so the port
opens at once: `/health` answers while loading, `/ready` and the API answer 503 until the
engine is warm. If loading fails the server exits non-zero rather than serving nothing.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from app.admission import build_admission
from app.dedup import DedupCache
from app.diagnostics import engine_process_init, install_tracemalloc
from app.errors import install_error_handlers
from app.metrics import install_metrics
from app.routes import router
from app.settings import Settings
from app.shutdown import DrainingServer
from app.state import RETRY_AFTER_SECONDS, ServerState
from middleware.auth import ApiKeyMiddleware
from middleware.body_limit import BodyLimitMiddleware
from middleware.draining import DrainingMiddleware
from middleware.idempotency import IdempotencyMiddleware, build_store
from middleware.rate_limit import Limits, RateLimitMiddleware, per_key_limits
from middleware.redis_backend import RedisBackend
from middleware.request_id import RequestIdMiddleware
from middleware.token_bucket import InProcessBuckets, RedisBuckets
from models.async_engine import AsyncEngine
from models.engine_spawn import SpawnedEngine

log = logging.getLogger("surge.server")

# NOTE: an idle connection must outlive the clients' own pool expiry (httpx and so the openai SDK:
# 5 s, uvicorn's default too), else a client reusing it races the close and gets "Server
# disconnected". Longer than proxies' usual idle timeouts (60 s) too, as nginx's 75 s.
KEEP_ALIVE_SECONDS = 75


def create_app(
    settings: Settings, on_fatal: Callable[[], None] | None = None, spawned: SpawnedEngine | None = None
) -> FastAPI:
    """The app; its lifespan starts the engine, or adopts `spawned`, a child started before (app/cli.py)."""
    state = ServerState(settings)
    if settings.redis_url:
        state.redis = RedisBackend(settings.redis_url, timeout=settings.redis_timeout_ms / 1000)
    state.dedup = DedupCache(ttl=settings.dedup_ttl_seconds, redis=state.redis)

    async def load() -> None:
        if state.redis is not None:
            # Wait for Redis a little (it may be starting beside us), then open one connection per
            # request the engine runs at once, before any burst comes.
            await state.redis.connect(attempts=settings.redis_connect_attempts, num_connections=settings.max_num_seqs)
        try:
            init = engine_process_init(settings.log_level, settings.log_format)
            state.engine = await AsyncEngine.start(
                settings.engine, observer=engine_metrics, process_init=init, spawned=spawned
            )
            state.admission = build_admission(
                settings.degradation, settings.admission, state.engine, num_held=lambda: state.num_held
            )
            # The imports, the tokenizer and the app are here for good: keep them out of the
            # garbage collector's walks, which otherwise cost the event loop ~15% of its time
            # under load (full collections over torch's and transformers' objects).
            gc.collect()
            gc.freeze()
            log.info("ready: serving %s as %r", settings.model, settings.model_name)
        except Exception as exc:
            log.exception("could not start the engine")
            state.load_error = exc
            if on_fatal is not None:
                on_fatal()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(load())
        try:
            yield
        finally:
            state.is_shutting_down = True
            loader.cancel()
            await state.dedup.aclose()
            if state.engine is not None:
                await asyncio.to_thread(state.engine.stop)
            if state.redis is not None:
                await state.redis.close()

    # NOTE: strict_content_type=False so `curl -d '{...}'` (sent as form-encoded) still parses as
    # JSON, as it does with OpenAI and vLLM.
    app = FastAPI(title="surge", version="0.1.0", lifespan=lifespan, strict_content_type=False)
    app.state.surge = state
    install_error_handlers(app)
    app.include_router(router)
    engine_metrics, http_metrics = install_metrics(app, state)  # GET /metrics

    # The one declaration of middleware order, outermost first; cheapest rejection first.
    # - Request id outermost, so every response (rejections included) echoes X-Request-Id and
    #   every log line of the request, uvicorn's access line included, carries it.
    # - CORS outside everything else, so preflights and every rejection carry CORS headers.
    # - HTTP metrics (app/metrics.py) outside every rejection, so 401s, 429s and 503s count too.
    # - Draining: after SIGTERM, 503 + Retry-After + Connection: close before any other work.
    # - API keys: 401 from headers alone, before any body is read.
    # - Body limit: 413 before anything buffers a body.
    # - Rate limits (when a limit is set): 429 on the requests bucket, outside idempotency, so a
    #   429 is never stored as an idempotent result and a retry runs again. The tokens bucket is
    #   checked by the routes, where the cost is known; this layer adds the x-ratelimit headers.
    # - Idempotency keys: replays and 409s never reach the model; only completed responses are
    #   stored. Always on: without an Idempotency-Key header a request passes at no cost.
    middleware: list[tuple[type, dict[str, object]]] = [
        (RequestIdMiddleware, {}),
        http_metrics,
        (
            DrainingMiddleware,
            {"is_draining": lambda: state.is_shutting_down, "retry_after_seconds": RETRY_AFTER_SECONDS},
        ),
        (ApiKeyMiddleware, _auth_options(settings)),
        (BodyLimitMiddleware, {"max_body_bytes": settings.max_body_bytes}),
        *_rate_limit_middleware(settings, state),
        (
            IdempotencyMiddleware,
            {
                "store": build_store(
                    state.redis,
                    ttl_seconds=settings.idempotency_ttl_seconds,
                    lease_seconds=settings.idempotency_lease_seconds,
                ),
                "counts": state.idempotency_counts,
            },
        ),
    ]
    if settings.cors_origin:
        middleware.insert(
            1,
            (
                CORSMiddleware,
                {
                    "allow_origins": list(settings.cors_origin),
                    "allow_methods": ["*"],
                    "allow_headers": ["*"],
                    "expose_headers": ["*"],
                },
            ),
        )
    for cls, options in reversed(middleware):
        app.add_middleware(cls, **options)  # type: ignore[arg-type]
    return app


def _auth_options(settings: Settings) -> dict[str, object]:
    """--api-key values and the keys of --keys-file are all accepted keys."""
    keys = settings.keys
    if keys is None:
        return {"api_keys": settings.api_key}
    return {"api_keys": (*settings.api_key, *keys.keys), "priority_tiers": keys.priority_tiers()}


def _rate_limit_middleware(settings: Settings, state: ServerState) -> list[tuple[type, dict[str, object]]]:
    """The rate-limit layer, when --rate-limit-rpm / --rate-limit-tpm or the keys file set a limit."""
    limits = Limits(settings.rate_limit_rpm, settings.rate_limit_tpm)
    key_limits = per_key_limits(settings.keys, limits) if settings.keys is not None else {}
    if not limits.is_limited and not any(key.is_limited for key in key_limits.values()):
        return []
    if state.redis is None:
        state.rate_limits = InProcessBuckets()
    else:
        state.rate_limits = RedisBuckets(state.redis, fallback_share=settings.rate_limit_replicas)
    options: dict[str, object] = {"buckets": state.rate_limits, "limits": limits, "key_limits": key_limits}
    return [(RateLimitMiddleware, {**options, "counts": state.rate_limit_counts})]


def serve(settings: Settings, spawned: SpawnedEngine | None = None) -> None:
    server: uvicorn.Server | None = None

    def fatal() -> None:
        if server is not None:
            server.should_exit = True

    def start_draining() -> None:
        state.is_shutting_down = True

    app = create_app(settings, on_fatal=fatal, spawned=spawned)
    state: ServerState = app.state.surge
    # log_config=None: uvicorn's loggers go through the root handler of app/logs.py (text or
    # JSON, with the request id) instead of uvicorn's own.
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        # NOTE: typed int in uvicorn, but it only reaches asyncio.wait_for, which takes a float.
        timeout_graceful_shutdown=settings.shutdown_grace_seconds,  # type: ignore[arg-type]
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    server = DrainingServer(config, on_shutdown_signal=start_draining, delay_seconds=settings.shutdown_delay_seconds)
    install_tracemalloc("server")  # off unless SURGE_TRACEMALLOC is set (app/diagnostics.py)
    server.run()
    if state.load_error is not None:
        raise SystemExit(1)
