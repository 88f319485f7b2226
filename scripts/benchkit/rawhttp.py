"""A minimal HTTP/1.1 client for the load generator: keep-alive connections, a POST, a streamed body.

Why not httpx: on a 2-core machine the load client shares the cores with the server it measures,
and httpx spent ~23 ms of CPU per 64-token stream (h11, its byte and line decoders, the pool's
locks): a 32-request burst took the client ~200 ms of a whole core to send, which set every
system's TTFT tail and took CPU from the servers. This client does what the benchmark needs and
nothing more: plain `http://`, requests with a body of known length, responses with
`Content-Length`, chunked or read-to-close bodies, no redirects, no compression, no proxies.
Every system under test is a uvicorn server, which is what it has been checked against.
Reads carry no timeout of their own (a timer per read costs what this client saves): callers
bound a whole request with `asyncio.timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit


class RawHttpError(Exception):
    """The connection failed or the server broke HTTP/1.1 framing."""


# What a read can raise on a dropped connection or a malformed response (ValueError: a bad
# chunk size or status code).
_READ_ERRORS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value


class RawHttpClient:
    """Keep-alive connections to one `http://host:port`, opened on demand and reused."""

    def __init__(self, base_url: str, connect_timeout: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"only http:// URLs are supported, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._host_header = f"{self.host}:{self.port}".encode()

    async def open_connections(self, count: int) -> None:
        """Open `count` connections now (before a measurement's clock runs) and keep them idle."""
        opened = await asyncio.gather(*(self._connect() for _ in range(count)))
        self._idle.extend(opened)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> AsyncIterator[tuple[Response, AsyncIterator[bytes]]]:
        """Send one request; yield the response head and an iterator over the body's bytes.

        The connection goes back to the pool only if the body was read to its end; a request
        abandoned part-way closes it (the server may still be writing)."""
        reused = bool(self._idle)
        conn = self._idle.pop() if reused else await self._connect()
        reusable = False
        head = [f"{method} {path} HTTP/1.1".encode(), b"host: " + self._host_header]
        head += [f"{name}: {value}".encode() for name, value in (headers or {}).items()]
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(b"content-length: %d" % len(body))
        request = b"\r\n".join(head) + b"\r\n\r\n" + body
        try:
            try:
                conn.writer.write(request)
                response = await _read_head(conn.reader)
            except _READ_ERRORS as exc:
                if not (reused and _closed_unanswered(exc)):
                    raise RawHttpError(f"{type(exc).__name__}: {exc}") from exc
                # The server closed an idle keep-alive connection before reading the request
                # (llama-server does after a stream): nothing was run; send it once more, anew.
                conn.close()
                conn = await self._connect()
                try:
                    conn.writer.write(request)
                    response = await _read_head(conn.reader)
                except _READ_ERRORS as again:
                    raise RawHttpError(f"{type(again).__name__}: {again}") from again
            state = {"done": False}
            yield response, _body(conn.reader, response, state)
            reusable = state["done"] and response.headers.get("connection", "").lower() != "close"
        finally:
            if reusable:
                self._idle.append(conn)
            else:
                conn.close()

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise RawHttpError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return _Connection(reader, writer)


def _closed_unanswered(exc: BaseException) -> bool:
    """A connection that ended before a single byte of the response."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return not exc.partial
    return isinstance(exc, ConnectionResetError | BrokenPipeError)


async def _read_head(reader: asyncio.StreamReader) -> Response:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
        raise RawHttpError(f"not an HTTP/1.x response: {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return Response(int(status_line[1]), headers)


async def _body(reader: asyncio.StreamReader, response: Response, state: dict[str, bool]) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive; sets state["done"] once its end was read."""
    try:
        async for chunk in _body_chunks(reader, response):
            yield chunk
    except _READ_ERRORS as exc:
        raise RawHttpError(f"{type(exc).__name__}: {exc}") from exc
    state["done"] = response.headers.get("transfer-encoding", "").lower() == "chunked" or (
        "content-length" in response.headers
    )


async def _body_chunks(reader: asyncio.StreamReader, response: Response) -> AsyncIterator[bytes]:
    if response.headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                break
            chunk = await reader.readexactly(size + 2)
            yield chunk[:-2]
    elif "content-length" in response.headers:
        left = int(response.headers["content-length"])
        while left > 0:
            chunk = await reader.read(min(left, 65536))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(chunk)
            yield chunk
    elif response.status not in (204, 304):
        while chunk := await reader.read(65536):  # read to close: the connection is not reused
            yield chunk
