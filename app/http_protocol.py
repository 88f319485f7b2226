"""uvicorn's httptools protocol with the bounds it lacks: header size, header time, body time.

httptools (what uvicorn picks when it is installed) reads request headers of any size (a 1 MB
header was accepted) and waits for them forever, so a client could hold memory, or a connection
slot, trickling bytes (slowloris). Here a request line plus headers over `--max-header-bytes` is a
400 (as h11's bound), and headers not complete within `--header-timeout-seconds` of the request's
first byte (or of the connection's opening) close the connection, and so does a body not
complete within `--body-timeout-seconds` of the end of its headers (the app, already reading it,
sees a disconnect and stops). Keep-alive connections between
requests are uvicorn's to time out (`timeout_keep_alive`); `--max-connections` is uvicorn's
`limit_concurrency` (a 503 past it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeadersTooLarge(Exception):
    """Raised from a parser callback: httptools turns it into a parse error, which uvicorn
    answers with a 400 and closes."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    # Set per server by `bounded_protocol`.
    max_header_bytes = 16 * 1024
    header_timeout_seconds = 10.0
    body_timeout_seconds = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        self._stop_body_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._start_header_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_header_timer()
        self._body_timer = self.loop.call_later(self.body_timeout_seconds, self._body_timeout)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._stop_body_timer()
        super().on_message_complete()

    def _count(self, num_bytes: int) -> None:
        self._header_bytes += num_bytes
        if self._header_bytes > self.max_header_bytes:
            raise HeadersTooLarge(f"request line and headers over {self.max_header_bytes} bytes")

    def _start_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_seconds, self._header_timeout)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timeout(self) -> None:
        self._body_timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.logger.warning("closing a connection whose request body took over %.0f s", self.body_timeout_seconds)
            self.transport.close()

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.logger.warning(
                "closing a connection whose request headers took over %.0f s", self.header_timeout_seconds
            )
            self.transport.close()


def bounded_protocol(
    max_header_bytes: int, header_timeout_seconds: float, body_timeout_seconds: float
) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with these bounds."""
    bounds = {
        "max_header_bytes": max_header_bytes,
        "header_timeout_seconds": header_timeout_seconds,
        "body_timeout_seconds": body_timeout_seconds,
    }
    return type("SurgeHttpProtocol", (BoundedHttpToolsProtocol,), bounds)
