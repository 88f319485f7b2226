"""Run an ASGI app under a real uvicorn server in a background thread, for HTTP tests; and surge
itself that way (`running_server`), its state within reach of the test.

    with serve_app(app) as base_url:
        httpx.get(f"{base_url}/health")
        openai.OpenAI(base_url=f"{base_url}/v1", api_key="k", max_retries=0)

    with running_server(model_dir, max_num_seqs=4) as live:
        live.url, live.state, live.engine

The port is free by construction: the socket is bound to port 0 here and handed to uvicorn,
so there is no window in which another process can take it. uvicorn does not install signal
handlers outside the main thread, so Ctrl-C still reaches pytest.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

from app.config.settings import Settings
from app.runtime.state import ServerState
from app.server.factory import create_app
from models.process.async_engine import AsyncEngine
from scripts.harness.servers import wait_until_ready

MODEL_NAME = "tiny-test"

STARTUP_TIMEOUT_S = 10.0
# Long enough for in-flight requests to finish; open streams are cut when it runs out.
GRACEFUL_SHUTDOWN_S = 3.0
JOIN_TIMEOUT_S = 10.0


@contextmanager
def serve_app(app: ASGIApp, **config: Any) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 and yield its base URL (`http://127.0.0.1:PORT`).

    Extra keyword arguments go to `uvicorn.Config` (e.g. `lifespan="on"`, `http="h11"`).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config.setdefault("log_level", "warning")
    config.setdefault("timeout_graceful_shutdown", GRACEFUL_SHUTDOWN_S)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="live-uvicorn", daemon=True)
    thread.start()
    try:
        _wait_started(server, thread)
        yield f"http://127.0.0.1:{port}"
    finally:
        is_stopped = _stop(server, thread)
        sock.close()
    # Outside `finally`, so a failing test's own exception is never masked by this one.
    if not is_stopped:
        raise RuntimeError("uvicorn test server did not shut down")


def _wait_started(server: uvicorn.Server, thread: threading.Thread) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("uvicorn test server exited during startup (see the log above)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"uvicorn test server did not start within {STARTUP_TIMEOUT_S} s")
        time.sleep(0.01)


def _stop(server: uvicorn.Server, thread: threading.Thread) -> bool:
    server.should_exit = True
    thread.join(JOIN_TIMEOUT_S)
    if thread.is_alive():
        # Past the graceful timeout something is stuck; force_exit skips waiting for it.
        server.force_exit = True
        thread.join(JOIN_TIMEOUT_S)
    return not thread.is_alive()


@dataclass(frozen=True)
class LiveServer:
    url: str
    state: ServerState

    @property
    def engine(self) -> AsyncEngine:
        assert self.state.engine is not None
        return self.state.engine

    @property
    def metrics_url(self) -> str:
        """Where Prometheus scrapes: the metrics port when there is one, else the API port."""
        port = self.state.settings.metrics_port
        return f"http://127.0.0.1:{port}/metrics" if port else f"{self.url}/metrics"

    def scrape(self) -> httpx.Response:
        """GET /metrics as Prometheus would: with the metrics key when one is set."""
        key = self.state.settings.metrics_key
        return httpx.get(self.metrics_url, headers={"authorization": f"Bearer {key}"} if key else {})

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until the engine holds no running or waiting request (fails the test if never)."""
        deadline = time.monotonic() + timeout
        core = self.engine.core
        while core.num_running or core.num_waiting or core._requests:
            if time.monotonic() > deadline:
                raise AssertionError(f"engine not idle: running={core.num_running} waiting={core.num_waiting}")
            time.sleep(0.01)


@contextmanager
def running_server(model: Path | str, **settings: object) -> Iterator[LiveServer]:
    """`model`: a model directory, or a name `--model` takes (`echo`).

    The engine runs on a thread here unless `engine_mode="process"` is passed: many tests reach
    into it (its counters, a failing forward pass). The process mode has its own tests
    (tests/models/process/test_parent.py, tests/app/test_engine_process_http.py) and is what
    `surge serve` subprocess tests run.
    """
    settings.setdefault("engine_mode", "thread")
    # No embedding model unless the test asks for one (`embedding_model="tiny"`): most tests serve
    # chat only, and an encoder per server was minutes of the suite.
    settings.setdefault("embedding_model", "")
    settings.setdefault("dtype", "float32")  # tests/conftest.py says why
    app = create_app(Settings(model=str(model), served_model_name=MODEL_NAME, **settings))  # type: ignore[arg-type]
    with serve_app(app) as base_url:
        wait_until_ready(f"{base_url}/ready", 60.0)
        yield LiveServer(base_url, app.state.surge)
