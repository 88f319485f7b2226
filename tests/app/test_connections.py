"""Connection bounds of `surge serve` (app/http_protocol.py): header size, header time, connections."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from scripts.harness.servers import ServerProcess, surge_argv


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    bounds = ("--max-header-bytes", "4096", "--header-timeout-seconds", "2", "--body-timeout-seconds", "2")
    argv = surge_argv("echo", *bounds, "--max-connections", "3")
    process = ServerProcess("surge", argv, tmp_path_factory.mktemp("conn") / "surge.log")
    process.start()
    try:
        yield process
    finally:
        process.stop(graceful=False)  # its shutdown is test_shutdown.py's; a graceful one paid a 2 s drain delay


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def reply(sock: socket.socket) -> bytes:
    try:
        return sock.recv(4096)
    except (ConnectionResetError, TimeoutError):
        return b""


def assert_trickle_is_cut_off(server: ServerProcess, start: bytes, byte: bytes) -> None:
    """Send `start`, then `byte` every 0.2 s: the server must close the connection, unanswered,
    within 6 s (its deadlines here are 2 s)."""
    with connect(server) as sock:
        sock.sendall(start)
        started = time.monotonic()
        while time.monotonic() - started < 6:
            try:
                sock.sendall(byte)
            except OSError:
                break  # closed by the server
            time.sleep(0.2)
        assert reply(sock) == b""  # closed, never answered
    assert time.monotonic() - started < 6, "the connection was never closed"


def test_headers_over_the_bound_are_a_400(server: ServerProcess) -> None:
    """The attack: httptools took request headers of any size (a 1 MB header was accepted)."""
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192 + b"\r\n\r\n")
        assert reply(sock).startswith(b"HTTP/1.1 400")
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Small: " + b"a" * 1000 + b"\r\n\r\n")
        assert reply(sock).startswith(b"HTTP/1.1 200")


def test_headers_that_trickle_past_the_deadline_lose_their_connection(server: ServerProcess) -> None:
    """The attack (slowloris): headers sent a byte at a time held a connection forever."""
    assert_trickle_is_cut_off(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"a")


def test_a_body_that_trickles_past_its_deadline_loses_its_connection(server: ServerProcess) -> None:
    """The attack: headers on time, then a body sent a byte at a time, held the connection (and
    the request's place in the app) for as long as the client liked."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    assert_trickle_is_cut_off(server, head + b'{"model": ', b" ")
    body = b'{"model": "echo", "prompt": "hi", "max_tokens": 2}'
    with connect(server) as sock:  # a body sent at once is not affected
        sock.sendall(head.replace(b"1000", str(len(body)).encode()) + body)
        assert reply(sock).startswith(b"HTTP/1.1 200")


def test_connections_past_the_limit_get_a_503(server: ServerProcess) -> None:
    idle = [connect(server) for _ in range(3)]
    try:
        time.sleep(0.2)  # the server has accepted them
        with connect(server) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reply(sock).startswith(b"HTTP/1.1 503")
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.2)
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reply(sock).startswith(b"HTTP/1.1 200")
