"""`--metrics-port`: GET /metrics, /health and /ready on a listener of their own.

The API port is the tenants'; /metrics shows every tenant's traffic (rates, latencies, errors,
grammars compiled), so with a port of its own it leaves the API port, and a NetworkPolicy admits
only Prometheus to it. /health and /ready are served there too, as vLLM's and Envoy's admin ports
do, so the kubelet's probes need not share the API port: its `--max-connections` bound answers
503 past it, and a liveness probe that met it would get a busy pod restarted. They stay on the
API port as well (Docker's HEALTHCHECK, load balancers).

A second uvicorn server on the API server's event loop, in the same process: it reads the same
registry and state as the API app. It owns no signals (the API server does: app/server/shutdown.py) and
no lifespan: the API app's lifespan starts it (binding its port first, so a port in use fails the
start-up) and stops it last, so Prometheus scrapes a draining server to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn
from fastapi import FastAPI

from app.config.settings import Settings
from app.ops.metrics import Endpoint
from app.runtime.connections import Connections
from app.runtime.state import ServerState
from app.server.http_protocol import bounded_protocol
from app.server.system import probes

log = logging.getLogger("surge.metrics")

STARTUP_TIMEOUT_S = 10.0


def metrics_app(state: ServerState, endpoint: Endpoint) -> FastAPI:
    """/metrics, /health and /ready over `state`: what the metrics port serves."""
    app = FastAPI(title="surge metrics", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.surge = state
    app.include_router(probes)
    app.add_api_route("/metrics", endpoint, methods=["GET"], include_in_schema=False)
    return app


# Connections the metrics port keeps open at most before it closes idle ones.
METRICS_MAX_CONNECTIONS = 64


class _Server(uvicorn.Server):
    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        # NOTE: uvicorn takes SIGINT and SIGTERM for every server it runs on the main thread; this
        # one must leave them to the API server's drain (app/server/shutdown.py).
        return contextlib.nullcontext()


class MetricsListener:
    def __init__(self, app: FastAPI, settings: Settings) -> None:
        self._host = settings.host
        self._port = settings.metrics_port
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,  # app/ops/logs.py's handler, as the API server's
            log_level=None,  # left as the API server set them (they are process-wide)
            http=bounded_protocol(
                settings.max_header_bytes,
                settings.header_timeout_seconds,
                settings.body_timeout_seconds,
                settings.send_timeout_seconds,
                # Its own registry: Prometheus and the kubelet, a handful of connections; idle ones
                # are closed first past the bound, and every path here is a probe's.
                Connections(METRICS_MAX_CONNECTIONS, 0),
            ),
            ws="none",
        )
        self._server = _Server(config)
        self._socket: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind the port (an OSError when it is taken) and serve it on this event loop."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, self._port))
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="metrics-port")
        self._task.add_done_callback(_report)
        deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if self._task.done() or asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the metrics port {self._host}:{self._port} did not start")
            await asyncio.sleep(0.01)
        log.info("serving /metrics, /health and /ready on %s:%d", self._host, self._port)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._socket is not None:
            self._socket.close()


def _report(task: asyncio.Task[None]) -> None:
    # No background task dies silently: the metrics port ending on its own is an ERROR.
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("the metrics port stopped", exc_info=exc)
