"""uvicorn's httptools protocol with the bounds it lacks: header size, header time, body time,
connections per address and in all, and a client that stops reading.

httptools (what uvicorn picks when it is installed) reads request headers of any size (a 1 MB
header was accepted) and waits for them forever, so a client could hold memory, or a connection
slot, trickling bytes (slowloris). Here a request line plus headers over `--max-header-bytes` is a
400 (as h11's bound), and headers not complete within `--header-timeout-seconds` of the request's
first byte (or of the connection's opening) close the connection, and so does a body not
complete within `--body-timeout-seconds` of the end of its headers (the app, already reading it,
sees a disconnect and stops). Keep-alive connections between requests are uvicorn's to time out
(`timeout_keep_alive`).

Each connection reports its phase (idle, receiving a request, being served) to the server's
`Connections` (app/runtime/connections.py), which bounds them per client address and in all, closing idle
ones first; it replaces uvicorn's `limit_concurrency`, which counted idle sockets and refused
probes. A request that may not start gets a 503 from `_admit`, before the app.

A response the client stops reading fills the socket, and uvicorn's `send` waits for it to drain
forever: the stream's request, its engine slot and its memory stayed. Once the transport has paused
writing for `--send-timeout-seconds` without resuming, the connection is aborted (its buffer
dropped; a `close()` would wait for it to drain); the app sees a disconnect, which aborts the
request in the engine (app/generation/sse.py's `on_close`), as when a client hangs up.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.runtime.connections import Connections, Phase
from middleware.errors import SERVER_ERROR, error_json, send_error

_FULL_BODY = error_json(
    "The server has too many open connections; retry shortly.", type=SERVER_ERROR, code="too_many_connections"
)


class HeadersTooLarge(Exception):
    """Raised from a parser callback: httptools turns it into a parse error, which uvicorn
    answers with a 400 and closes."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    # Set per server by `bounded_protocol`.
    max_header_bytes = 16 * 1024
    header_timeout_seconds = 10.0
    body_timeout_seconds = 30.0
    send_timeout_seconds = 60.0  # 0 = off
    # NOTE: not `connections`: uvicorn sets that name on each protocol (its own set of them).
    registry: ClassVar[Connections]  # the server's: each server makes its own class

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._is_receiving = False  # between a request's first byte and its end
        # uvicorn runs `self.app` for each request: the gate goes in front of the server's app.
        self._server_app = self.app
        self.app = self._admit

    @property
    def address(self) -> str:
        return self.client[0] if self.client else ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()
        if not self.registry.admit(self):
            _warn_sometimes(self, self.registry.num_refused_address + self.registry.num_refused_full)
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.remove(self)
        self._stop_header_timer()
        self._stop_body_timer()
        self._stop_send_timer()
        super().connection_lost(exc)

    def close_now(self) -> None:
        """Close at once (an idle connection closed to make room): what it has not read is dropped."""
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        elif not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._start_header_timer()
        self._is_receiving = True
        self._report_phase()

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
        self._is_receiving = False
        self._report_phase()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._report_phase()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.send_timeout_seconds and self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout_seconds, self._send_timeout)

    def resume_writing(self) -> None:
        self._stop_send_timer()
        super().resume_writing()

    def timeout_keep_alive_handler(self) -> None:
        # uvicorn's close() would wait, forever, for a client that stopped reading to take the rest.
        self.close_now()

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.registry.may_serve(scope["path"]):
            await self._server_app(scope, receive, send)
            return
        _warn_sometimes(self, self.registry.num_over_limit)
        await send_error(send, 503, _FULL_BODY, [("retry-after", "1"), ("connection", "close")])

    def _report_phase(self) -> None:
        if self._is_receiving:
            phase = Phase.RECEIVING
        elif self.cycle is not None and not self.cycle.response_complete:
            phase = Phase.SERVING  # the latest request (pipelined ones queue behind it) is being answered
        else:
            phase = Phase.IDLE
        self.registry.set_phase(self, phase)

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

    def _stop_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

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

    def _send_timeout(self) -> None:
        self._send_timer = None
        self.registry.num_send_timeouts += 1
        self.logger.warning(
            "cutting a connection whose client read nothing for %.0f s (%d bytes unsent)",
            self.send_timeout_seconds,
            self.transport.get_write_buffer_size(),
        )
        self.transport.abort()


def _warn_sometimes(protocol: BoundedHttpToolsProtocol, count: int) -> None:
    """A WARNING at the 1st, 10th, 100th... connection refused: an attack must not flood the log;
    `surge_connections_closed_total` counts them all."""
    if count > 0 and str(count).strip("0") == "1":
        connections = protocol.registry
        protocol.logger.warning(
            "connections refused or closed so far: %d from one address past --max-connections-per-address (%d), "
            "%d past --max-connections (%d) and its probe reserve, %d requests answered 503 past it",
            connections.num_refused_address,
            connections.max_per_address,
            connections.num_refused_full,
            connections.max_connections,
            connections.num_over_limit,
        )


def bounded_protocol(
    max_header_bytes: int,
    header_timeout_seconds: float,
    body_timeout_seconds: float,
    send_timeout_seconds: float,
    connections: Connections,
) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with these bounds and this server's connections."""
    bounds = {
        "max_header_bytes": max_header_bytes,
        "header_timeout_seconds": header_timeout_seconds,
        "body_timeout_seconds": body_timeout_seconds,
        "send_timeout_seconds": send_timeout_seconds,
        "registry": connections,
    }
    return type("SurgeHttpProtocol", (BoundedHttpToolsProtocol,), bounds)
