"""The app factory and the process: lifespan, uvicorn.

The lifespan owns every long-lived object. The model loads in the background so the port
opens at once: `/health` answers while loading, `/ready` and the API answer 503 until the
engine is warm. If loading fails the server exits non-zero rather than serving nothing. The
lifespan also runs the metrics port (`--metrics-port`, app/server/metrics_port.py) and the keys file's
reloads (app/server/keys_reload.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from app.config.settings import Settings
from app.generation.pipeline import build_pipeline
from app.ops.diagnostics import engine_process_init, install_tracemalloc
from app.ops.engine_metrics import EngineMetrics
from app.ops.kv_events import KvEventPublisher
from app.ops.metrics import install_metrics
from app.reasoning import template_reasons
from app.runtime.connections import Connections
from app.runtime.response_storage import ResponseStorage
from app.runtime.response_store import ResponseStore, StoreLimits
from app.runtime.response_store_redis import RedisResponseStore
from app.runtime.served import ServedModel
from app.runtime.state import ServerState
from app.runtime.warm_templates import load_templates, warm
from app.server.door import install_door_layers
from app.server.errors import install_error_handlers
from app.server.http_protocol import bounded_protocol
from app.server.keys_reload import reloading_keys
from app.server.metrics_port import MetricsListener, metrics_app
from app.server.routes import router
from app.server.shutdown import DrainingServer
from app.tools.formats import format_for
from middleware.dedup.cache import DedupCache
from middleware.dedup.similar import SimilarQueries
from middleware.edge.auth_failures import AuthFailures
from middleware.key_ring import KeyRing, KeySet, KeysFileWatcher
from middleware.redis import RedisBackend
from models import AsyncEngine, Embedder, SpawnedEngine, start_embeddings

log = logging.getLogger("surge.server")

# NOTE: an idle connection must outlive the clients' own pool expiry (httpx and so the openai SDK:
# 5 s, uvicorn's default too), else a client reusing it races the close and gets "Server
# disconnected". Longer than proxies' usual idle timeouts (60 s) too, as nginx's 75 s.
KEEP_ALIVE_SECONDS = 75


def create_app(
    settings: Settings, on_fatal: Callable[[], None] | None = None, spawned: SpawnedEngine | None = None
) -> FastAPI:
    """The app; its lifespan starts the engine, or adopts `spawned`, a child started before (app/cli.py)."""
    state = ServerState(
        settings,
        auth_failures=AuthFailures(settings.auth_failures_per_minute),
        connections=Connections(settings.max_connections, settings.max_connections_per_address),
    )
    state.keys = KeyRing(KeySet.from_file(settings.api_key, settings.keys, settings.rate_limits))
    state.redis = _redis(settings, settings.redis_url)
    state.redis_cache = state.redis
    if settings.redis_cache_url and settings.redis_cache_url != settings.redis_url:
        state.redis_cache = _redis(settings, settings.redis_cache_url)
    backends = state.redis_backends
    limits = StoreLimits(
        settings.responses_store_max_entries, settings.responses_store_max_bytes, settings.responses_store_ttl_seconds
    )
    shared = RedisResponseStore(state.redis_cache, limits) if state.redis_cache is not None else None
    state.responses = ResponseStorage(ResponseStore(limits), shared)
    state.dedup = DedupCache(ttl=settings.dedup_ttl_seconds, redis=state.redis_cache, scope=settings.dedup_scope)
    state.similar = SimilarQueries(ttl=settings.dedup_ttl_seconds)
    templates = load_templates(settings.warm_templates) if settings.warm_templates else []  # a bad file: no start

    async def load() -> None:
        for backend in backends:
            # Wait for Redis a little (it may be starting beside us), then open one connection per
            # request the engine runs at once, before any burst comes.
            await backend.connect(attempts=settings.redis_connect_attempts, num_connections=settings.max_num_seqs)
        try:
            engines = await _start_engines(settings, observer_for, spawned)
            if settings.embedding_model:
                # After the engines are warm, not beside them: a CPU engine's warm-up times its
                # decode step on each thread count (models/runner/decode_threads.py), and torch's
                # import and the encoder's load beside it skewed that choice.
                try:
                    state.embeddings = await _load_encoder(settings)
                except BaseException:
                    await asyncio.gather(*(asyncio.to_thread(engine.stop) for engine in engines))
                    raise
            main = engines[0]
            if settings.chat_template_text is not None:
                main.tokenizer.use_chat_template(settings.chat_template_text)
            await warm(main, templates)  # before /ready: the first request finds them cached
            served = {}
            for index, ((name, source), engine) in enumerate(zip(settings.chat_models, engines, strict=True)):
                # --tool-call-parser names the main model's format; a further model's is read from its template.
                parser = None if settings.tool_call_parser == "auto" or index else settings.tool_call_parser
                template = engine.tokenizer.hf.chat_template
                pipeline, admission = build_pipeline(settings, state, engine, name)
                served[name] = ServedModel(
                    name,
                    source,
                    settings.version_label,  # the deployment's: one per pod, what a canary is compared by
                    engine,
                    format_for(template, parser),
                    template_reasons(template),
                    pipeline,
                    admission,
                )
            state.admission = served[settings.model_name].admission  # the door's queue check is the main model's
            state.engine = main
            state.models = served
            # The imports, the tokenizer and the app are here for good: keep them out of the
            # garbage collector's walks: full collections over torch's and transformers' objects
            # otherwise take a good share of the event loop's time under load.
            gc.collect()
            gc.freeze()
            log.info("ready: serving %s", ", ".join(f"{source} as {name!r}" for name, source in settings.chat_models))
        except Exception as exc:
            log.exception("could not start the engine")
            state.load_error = exc
            if on_fatal is not None:
                on_fatal()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # First: a metrics port that is taken fails the start-up before anything else starts.
        listener = MetricsListener(metrics_app(state, scrape), settings) if settings.metrics_port else None
        if listener is not None:
            await listener.start()
        # Before the engine starts, so that no block it stores goes unpublished; an address that
        # cannot be bound fails the start-up.
        publisher = None
        if settings.kv_events_endpoint:
            endpoint, topic, form = settings.kv_events_endpoint, settings.kv_events_topic, settings.kv_events_format
            publisher = KvEventPublisher(endpoint, topic, form)
            observer_for(settings.model_name).kv_events = publisher.publish  # the main model's blocks
        watcher = None
        if settings.keys_file:
            watcher = KeysFileWatcher(
                state.keys, settings.keys_file, api_keys=settings.api_key, default_limits=settings.rate_limits
            )
        loader = asyncio.create_task(load())
        try:
            async with reloading_keys(watcher, settings.keys_file_reload_seconds):
                yield
        finally:
            state.is_shutting_down = True
            loader.cancel()
            await state.background.aclose()  # each run records that it failed, while Redis is open
            await state.dedup.aclose()
            if state.models:
                await asyncio.gather(*(asyncio.to_thread(served.engine.stop) for served in state.models.values()))
            if state.embeddings is not None:
                await asyncio.to_thread(state.embeddings.stop)
            for backend in backends:
                await backend.close()
            if publisher is not None:
                await asyncio.to_thread(publisher.close)
            if listener is not None:
                await listener.stop()

    # NOTE: strict_content_type=False so `curl -d '{...}'` (sent as form-encoded) still parses as
    # JSON, as it does with OpenAI and vLLM.
    app = FastAPI(title="surge", version="0.1.0", lifespan=lifespan, strict_content_type=False)
    app.state.surge = state
    install_error_handlers(app)
    app.include_router(router)
    observer_for, http_metrics, scrape = install_metrics(app, state)  # GET /metrics

    install_door_layers(app, settings, state, http_metrics)
    return app


async def _start_engines(
    settings: Settings,
    observer_for: Callable[[str], EngineMetrics],
    spawned: SpawnedEngine | None,
) -> list[AsyncEngine]:
    """Every chat model's engine, started together (the main one may be a child started before);
    if one fails, those that started are stopped."""
    init = engine_process_init(settings.log_level, settings.log_format)
    models = settings.chat_models
    starts = [
        AsyncEngine.start(
            settings.engine if index == 0 else settings.engine_of(source),
            observer=observer_for(name),
            process_init=init,
            spawned=spawned if index == 0 else None,
        )
        for index, (name, source) in enumerate(models)
    ]
    results = await asyncio.gather(*starts, return_exceptions=True)
    failed = next((result for result in results if isinstance(result, BaseException)), None)
    if failed is None:
        return [result for result in results if isinstance(result, AsyncEngine)]
    await asyncio.gather(*(asyncio.to_thread(r.stop) for r in results if isinstance(r, AsyncEngine)))
    raise failed


async def _load_encoder(settings: Settings) -> Embedder:
    """The embedding model and its batching loop (models/embedding/): in a process of its own when
    the engines have theirs, so this process never imports torch."""
    return await start_embeddings(
        settings.embedding_model,
        device=settings.device,
        threads=settings.embedding_threads,
        attempts=settings.download_attempts,
        separate_process=settings.engine_mode == "process",
        init=engine_process_init(settings.log_level, settings.log_format, role="embedding"),
    )


def _redis(settings: Settings, url: str) -> RedisBackend | None:
    if not url:
        return None
    return RedisBackend(url, timeout=settings.redis_timeout_ms / 1000, down_after=settings.redis_down_after_failures)


def warn_if_open(settings: Settings) -> None:
    """A WARNING when anyone who can reach the address may use the server (auth off, not loopback)."""
    is_loopback = settings.host in ("localhost", "::1") or settings.host.startswith("127.")
    if not is_loopback and not settings.is_auth_on:
        names = (
            "; requests by a host name other than localhost or an --allowed-host one get a 421"
            if "*" not in settings.allowed_host
            else ""
        )
        log.warning(
            "auth is off (no --api-key or --keys-file) and surge listens on %s: anyone who can reach it "
            "can use it, as one tenant%s",
            settings.host,
            names,
        )


def serve(settings: Settings, spawned: SpawnedEngine | None = None) -> None:
    server: uvicorn.Server | None = None

    def fatal() -> None:
        if server is not None:
            server.should_exit = True

    def start_draining() -> None:
        state.is_shutting_down = True

    app = create_app(settings, on_fatal=fatal, spawned=spawned)
    state: ServerState = app.state.surge
    warn_if_open(settings)
    # log_config=None: uvicorn's loggers go through the root handler of app/ops/logs.py (text or
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
        # NOTE: no `limit_concurrency`: it counted idle sockets and refused probes; the protocol
        # bounds connections itself (app/runtime/connections.py).
        http=bounded_protocol(
            settings.max_header_bytes,
            settings.header_timeout_seconds,
            settings.body_timeout_seconds,
            settings.send_timeout_seconds,
            state.connections,
        ),
        # surge serves no WebSocket; an upgraded connection would leave the bounded protocol.
        ws="none",
    )
    server = DrainingServer(config, on_shutdown_signal=start_draining, delay_seconds=settings.shutdown_delay_seconds)
    install_tracemalloc("server")  # off unless SURGE_TRACEMALLOC is set (app/ops/diagnostics.py)
    server.run()
    if state.load_error is not None:
        raise SystemExit(1)
