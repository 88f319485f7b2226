"""HTTP keep-alive: an idle connection outlives the clients' own idle expiry."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

from scripts.harness.servers import surge_server

# httpx's (and so the openai SDK's) default keepalive_expiry: a pooled connection idle this long
# is reused until then, so the server must not close it first.
CLIENT_KEEPALIVE_EXPIRY_S = 5.0


def _get(sock: socket.socket, host: str) -> bytes:
    """One whole response, body included: the body may come in a later segment than the headers,
    and left unread it would be taken for the start of the next response."""
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(4096)
        if not chunk:
            return reply  # the server closed the connection
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    assert length is not None, head
    while len(body) < int(length.group(1)):
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_idle_connection_outlives_the_clients_keepalive_expiry(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Regression (keys burst: a quiet key's request failed with a connection error): uvicorn's
    default keep-alive timeout is 5 s, the same as httpx's pool expiry, so a client reusing a
    connection idle for about 5 s raced the server closing it and got "Server disconnected"."""
    with surge_server(tiny_model_dir, tmp_path / "server.log", graceful_stop=False) as server:
        address = urlparse(server.url)
        assert address.hostname is not None and address.port is not None
        with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
            assert _get(sock, address.netloc).startswith(b"HTTP/1.1 200")
            time.sleep(CLIENT_KEEPALIVE_EXPIRY_S + 1.0)
            assert _get(sock, address.netloc).startswith(b"HTTP/1.1 200"), "the server closed the idle connection"
