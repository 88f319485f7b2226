"""Run an ASGI app under a real uvicorn server in a background thread, for HTTP tests.

    with serve_app(app) as base_url:
        httpx.get(f"{base_url}/health")
        openai.OpenAI(base_url=f"{base_url}/v1", api_key="k", max_retries=0)

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
from typing import Any

import uvicorn
from starlette.types import ASGIApp

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
