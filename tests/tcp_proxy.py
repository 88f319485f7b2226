"""A TCP proxy on loopback that can make a backend slow or flaky, for fault tests.

It runs its own asyncio loop in a child process (not a thread: a busy test process would hold
the GIL and delay the bytes by itself), so a plain (sync) test and `surge serve` subprocesses
can both use it; its knobs are shared memory. Point a client at `proxy.port` (or
`proxy.redis_url`) instead of the backend's port; by default bytes pass through untouched.

    with TcpProxy(redis.port) as proxy:      # forwards 127.0.0.1:proxy.port -> 127.0.0.1:redis.port
        proxy.latency = 0.2                  # every chunk, each way, arrives 200 ms late
        proxy.refuse = True                  # new connections are closed at once
        proxy.drop_connections()             # every open connection is closed now
        proxy.latency, proxy.refuse = 0.0, False
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
import time
from collections import deque
from multiprocessing.sharedctypes import Synchronized

from scripts.harness.service import Service

CHUNK_BYTES = 65536
_CTX = multiprocessing.get_context("spawn")


class TcpProxy(Service):
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self._latency: Synchronized[float] = _CTX.Value("d", 0.0)  # type: ignore[assignment]
        self._refuse: Synchronized[bool] = _CTX.Value("b", False)  # type: ignore[assignment]
        self._drops: Synchronized[int] = _CTX.Value("i", 0)  # type: ignore[assignment]
        self._process = _CTX.Process(
            target=_serve,
            args=(self._sock, target_host, target_port, self._latency, self._refuse, self._drops),
            name="tcp-proxy",
            daemon=True,
        )

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def latency(self) -> float:
        """Seconds added to every chunk in each direction (read when the chunk arrives)."""
        return float(self._latency.value)

    @latency.setter
    def latency(self, seconds: float) -> None:
        self._latency.value = seconds

    @property
    def refuse(self) -> bool:
        """Close new connections at once instead of forwarding them."""
        return bool(self._refuse.value)

    @refuse.setter
    def refuse(self, is_refused: bool) -> None:
        self._refuse.value = is_refused

    def start(self) -> None:
        self._sock.listen(128)
        self._process.start()

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.kill()
        self._process.join(5)
        self._sock.close()

    def drop_connections(self) -> None:
        """Close every open connection (both sides) now, as a network failure would."""
        with self._drops.get_lock():
            self._drops.value += 1
        time.sleep(0.05)  # the child looks every few milliseconds


# --- the child process ------------------------------------------------------------------------------


def _serve(
    sock: socket.socket,
    target_host: str,
    target_port: int,
    latency: Synchronized[float],
    refuse: Synchronized[bool],
    drops: Synchronized[int],
) -> None:
    asyncio.run(_Proxy(target_host, target_port, latency, refuse, drops).serve(sock))


class _Proxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        latency: Synchronized[float],
        refuse: Synchronized[bool],
        drops: Synchronized[int],
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.latency = latency
        self.refuse = refuse
        self.drops = drops
        self.writers: set[asyncio.StreamWriter] = set()

    async def serve(self, sock: socket.socket) -> None:
        server = await asyncio.start_server(self.handle, sock=sock)
        seen = self.drops.value
        async with server:
            while True:  # drop requests from the parent
                await asyncio.sleep(0.002)
                if self.drops.value != seen:
                    seen = self.drops.value
                    for writer in list(self.writers):
                        writer.close()
                    self.writers.clear()

    async def handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.refuse.value:
            client_writer.close()
            return
        try:
            backend_reader, backend_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:  # the backend is down: the client sees its connection closed
            client_writer.close()
            return
        self.writers |= {client_writer, backend_writer}
        try:
            await asyncio.gather(
                self.pipe(client_reader, backend_writer),
                self.pipe(backend_reader, client_writer),
            )
        finally:
            for writer in (client_writer, backend_writer):
                writer.close()
                self.writers.discard(writer)

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction; each chunk goes out `latency` after it came in, order kept."""
        loop = asyncio.get_running_loop()
        pending: deque[tuple[float, bytes]] = deque()
        arrived = asyncio.Event()
        is_eof = False

        async def read() -> None:
            nonlocal is_eof
            try:
                while chunk := await reader.read(CHUNK_BYTES):
                    pending.append((loop.time() + self.latency.value, chunk))
                    arrived.set()
            except OSError:
                pass
            finally:
                is_eof = True
                arrived.set()

        reading = asyncio.create_task(read())
        try:
            while True:
                if not pending:
                    if is_eof:
                        return
                    arrived.clear()
                    await arrived.wait()
                    continue
                due, chunk = pending[0]
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                pending.popleft()
                if writer.is_closing():
                    return
                writer.write(chunk)
                await writer.drain()
        except OSError:
            return
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            writer.close()
