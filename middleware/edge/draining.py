"""Polite refusal while the server drains for shutdown, as a pure ASGI middleware.

Owns one rule: once `is_draining()` is true, a new HTTP request (other than the probe and
scrape paths) gets a 503 with `Retry-After` and `Connection: close`, before any other work.
Requests already inside the app are not touched: they run to the end.

Why a window at all: after SIGTERM, Kubernetes keeps routing traffic to the pod until the
endpoint removal reaches every proxy. Closing the listener at once would turn that traffic into
connection errors; answering 503 + `Connection: close` makes clients retry elsewhere, and the
closed connection stops keep-alive clients from reusing this pod.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from middleware.errors import error_json, send_error

# Probes and scrapes still get their real answer: /ready says 503 itself, /health stays 200
# (the process is alive; a liveness failure would only restart a pod that is leaving anyway).
DEFAULT_EXEMPT_PATHS = ("/health", "/ready", "/metrics")

_BODY = error_json("The server is shutting down; retry on another replica.", type="server_error", code="shutting_down")


class DrainingMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        is_draining: Callable[[], bool],
        retry_after_seconds: float,
        exempt_paths: Iterable[str] = DEFAULT_EXEMPT_PATHS,
    ) -> None:
        if retry_after_seconds < 0:
            raise ValueError("retry_after_seconds must not be negative")
        self.app = app
        self.is_draining = is_draining
        self.retry_after = str(max(1, round(retry_after_seconds)))
        self.exempt_paths = frozenset(exempt_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.is_draining() or scope["path"] in self.exempt_paths:
            await self.app(scope, receive, send)
            return
        await send_error(send, 503, _BODY, [("retry-after", self.retry_after), ("connection", "close")])
