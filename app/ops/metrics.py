"""Prometheus metrics: `GET /metrics`, HTTP metrics, and the engine's and traffic layers' figures.

Three sources, one per-app `CollectorRegistry` (several apps in one process never collide):
- HTTP requests and latency by handler and status: prometheus-fastapi-instrumentator's pure
  ASGI middleware (it looks at `http.response.start` only; bodies, streams included, pass
  through untouched, one extra `await` per message);
- events of the engine thread (latencies, tokens, batch sizes, finishes): `EngineMetrics`, the
  engine's `EngineObserver`; histogram and counter updates are thread-safe and take no
  allocation beyond the engine's own list of gaps per step;
- everything that is a level or a counter owned by someone else (queue depth, KV usage,
  degradation level, aborts, 429s, idempotency, dedup, shedding, Redis, GPU): read when
  Prometheus scrapes, by `ServerCollector`, so `middleware/` and `models/` import no Prometheus.

Every surge metric has the served model's name as its `model` label. Names are a contract
(the HPA, the adapter rules and the dashboard use them): change them only with k8s/.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Awaitable, Callable, Iterator

from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware
from starlette.responses import Response

from app.ops.embedding_metrics import EmbeddingCollector
from app.ops.engine_metrics import EngineFamilies, EngineMetrics
from app.ops.model_metrics import model_metrics
from app.ops.vllm_names import cache_config_info, with_vllm_names
from app.response_format import CONSTRAINED_KINDS
from app.runtime.connections import Connections
from app.runtime.state import ServerState
from middleware.errors import error_json
from models import read_gpu_stats

log = logging.getLogger("surge.metrics")


class ServerCollector(Collector):
    """Levels and other layers' counters, read at scrape time."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._model = state.settings.model_name

    def collect(self) -> Iterator[Metric]:
        """Every family, with vLLM's names for those the routers read (app/ops/vllm_names.py)."""
        yield from with_vllm_names(self._collect())
        engine = self._state.engine
        if engine is not None:
            scheduler = engine.config.scheduler
            block = scheduler.prefix_cache_block_size
            capacity = scheduler.max_kv_tokens or scheduler.max_num_seqs * scheduler.max_model_len
            dtype = engine.config.model.dtype
            yield cache_config_info(self._model, block, capacity // block, scheduler.prefix_caching, dtype)

    def _collect(self) -> Iterator[Metric]:
        state, model = self._state, self._model

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model"])
            family.add_metric([model], value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["model"])
            family.add_metric([model], value)
            return family

        yield from model_metrics(state)
        limited = CounterMetricFamily(
            "surge_rate_limited_requests",
            "Requests refused with 429, by bucket (concurrency: the key's sequences in flight; queue_share: its"
            " share of the queue).",
            labels=["model", "bucket"],
        )
        limited.add_metric([model, "requests"], state.rate_limit_counts.num_limited_requests)
        limited.add_metric([model, "tokens"], state.rate_limit_counts.num_limited_tokens)
        limited.add_metric([model, "concurrency"], state.concurrency_counts.num_limited)
        over_share = sum(served.admission.num_over_share for served in state.models.values())
        limited.add_metric([model, "queue_share"], over_share)
        yield limited
        idempotency = state.idempotency_counts
        yield counter(
            "surge_idempotent_replays", "Stored responses replayed for an Idempotency-Key.", idempotency.num_replays
        )
        yield counter(
            "surge_idempotency_conflicts",
            "Idempotency-Key conflicts: 409 (still running) and 422 (reused with another body).",
            idempotency.num_conflicts,
        )
        yield counter("surge_dedup_hits", "Requests that joined or replayed a shared generation.", state.dedup.num_hits)
        yield counter("surge_dedup_misses", "Dedup-eligible requests that ran the engine.", state.dedup.num_misses)
        constrained = CounterMetricFamily(
            "surge_constrained_requests",
            "Requests whose output a grammar constrains, by kind (json_object, json_schema).",
            labels=["model", "kind"],
        )
        for kind in CONSTRAINED_KINDS:
            constrained.add_metric([model, kind], state.constrained_requests[kind])
        yield constrained
        auth = CounterMetricFamily(
            "surge_auth_failures",
            "Requests with a missing or wrong API key: rejected (401) or throttled (429, too many from one address).",
            labels=["model", "outcome"],
        )
        auth.add_metric([model, "rejected"], state.auth_failures.num_rejected)
        auth.add_metric([model, "throttled"], state.auth_failures.num_throttled)
        yield auth
        yield from _connection_metrics(state.connections, model, gauge)
        yield counter(
            "surge_redis_fallbacks",
            "Times Redis became unreachable and shared state fell back to this process.",
            sum(backend.num_fallbacks for backend in state.redis_backends),
        )
        yield from self._gpu()

    def _gpu(self) -> Iterator[Metric]:
        # Read where CUDA lives: the engine process reports its figures (models/runner/gpu.py).
        engine = self._state.engine
        stats = engine.core.gpu_stats() if engine is not None else read_gpu_stats()
        if not stats:
            return
        memory = GaugeMetricFamily(
            "surge_gpu_memory_used_bytes",
            "GPU memory in use on the device (all processes).",
            labels=["model", "device"],
        )
        utilization = GaugeMetricFamily(
            "surge_gpu_utilization_ratio",
            "GPU busy time over the last sample period (NVML).",
            labels=["model", "device"],
        )
        for device, used_bytes, _, busy in stats:
            memory.add_metric([self._model, device], used_bytes)
            if busy is not None:
                utilization.add_metric([self._model, device], busy)
        yield memory
        if any(busy is not None for *_, busy in stats):
            yield utilization


Endpoint = Callable[[Request], Awaitable[Response]]


def install_metrics(
    app: FastAPI, state: ServerState
) -> tuple[Callable[[str], EngineMetrics], tuple[type, dict[str, object]], Endpoint]:
    """Add the server collector, and `GET /metrics` to `app` unless `--metrics-port` serves it; return
    each served model's engine observer (by its name), the HTTP metrics middleware entry for the
    app's middleware list, and the endpoint for the metrics port (app/server/metrics_port.py)."""
    settings = state.settings
    registry = CollectorRegistry()
    registry.register(ServerCollector(state))
    registry.register(EmbeddingCollector(state))
    families = EngineFamilies(registry)
    observers: dict[str, EngineMetrics] = {}

    def observer_for(model: str) -> EngineMetrics:
        if model not in observers:
            observers[model] = EngineMetrics(families, model)
        return observers[model]

    if not settings.metrics_port:
        if settings.is_auth_on and not settings.metrics_key:
            log.warning(
                "API keys are set but neither --metrics-key nor --metrics-port: GET /metrics answers 403 on the"
                " API port (it shows every tenant's traffic)"
            )
        endpoint = _endpoint(registry, state, is_api_port=True)
        app.add_api_route("/metrics", endpoint, methods=["GET"], include_in_schema=False)
    middleware = (
        PrometheusInstrumentatorMiddleware,
        # Exact statuses: 429 and 503 are what an operator looks for. Scrapes are not traffic.
        {"should_group_status_codes": False, "excluded_handlers": ["^/metrics$"], "registry": registry},
    )
    return observer_for, middleware, _endpoint(registry, state, is_api_port=False)


def _endpoint(registry: CollectorRegistry, state: ServerState, *, is_api_port: bool) -> Endpoint:
    """GET /metrics. The metrics tell who is served how much and how fast (rates, errors, latencies,
    grammars compiled): with --metrics-key they are for whoever holds it (Prometheus' `authorization`
    setting), and a wrong key counts as a failed authentication of its address (throttled as API
    keys are); without one, with API keys set, they are not for the API port, where the tenants are."""
    settings, failures = state.settings, state.auth_failures
    metrics_key = settings.metrics_key.encode()
    is_closed = is_api_port and settings.is_auth_on and not metrics_key

    # NOTE: async on purpose: the collector runs on the event loop, like every other reader of
    # the degradation level (whose hysteresis a scrape advances), never in a worker thread.
    async def metrics(request: Request) -> Response:
        if is_closed:
            message = (
                "GET /metrics is closed on the API port while API keys are set: it shows every tenant's traffic."
                " Set --metrics-key (sent as Authorization: Bearer <key>) or --metrics-port (a port of its own)."
            )
            body = error_json(message, type="invalid_request_error", code="metrics_closed")
            return Response(body, status_code=403, media_type="application/json")
        presented = request.headers.get("authorization", "").encode()
        if metrics_key and not hmac.compare_digest(presented, b"Bearer " + metrics_key):
            address = request.client.host if request.client is not None else "unknown"
            if not failures.allows_attempt(address):
                retry_after = str(max(1, math.ceil(failures.retry_after(address))))
                message = "Too many failed authentications from this address; retry later."
                body = error_json(message, type="invalid_request_error", code="rate_limit_exceeded")
                return Response(body, 429, media_type="application/json", headers={"retry-after": retry_after})
            failures.failed(address)
            message = "GET /metrics needs the metrics key (Authorization: Bearer <--metrics-key>)."
            body = error_json(message, type="invalid_request_error", code="invalid_api_key")
            headers = {"www-authenticate": "Bearer"}
            return Response(body, status_code=401, media_type="application/json", headers=headers)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


def _connection_metrics(
    connections: Connections, model: str, gauge: Callable[[str, str, float], GaugeMetricFamily]
) -> Iterator[Metric]:
    yield gauge("surge_connections_open", "Open HTTP connections.", connections.num_open)
    yield gauge("surge_connections_idle", "Open HTTP connections between requests.", connections.num_idle)
    closed = CounterMetricFamily(
        "surge_connections_closed",
        "Connections closed or refused by a bound: evicted (idle, to make room), per_address (new, its address"
        " full), full (new, past --max-connections and its probe reserve), over_limit (a request answered 503"
        " past --max-connections), send_timeout (a client that read nothing).",
        labels=["model", "reason"],
    )
    closed.add_metric([model, "evicted"], connections.num_evicted)
    closed.add_metric([model, "per_address"], connections.num_refused_address)
    closed.add_metric([model, "full"], connections.num_refused_full)
    closed.add_metric([model, "over_limit"], connections.num_over_limit)
    closed.add_metric([model, "send_timeout"], connections.num_send_timeouts)
    yield closed
