"""A free TCP port on loopback, for servers the tests start as subprocesses."""

from __future__ import annotations

import socket


def free_port() -> int:
    # NOTE: the port is free when this returns; a subprocess binds it a moment later. Fine on a
    # test machine; in-process servers use tests/live_server.py, which hands uvicorn the socket.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
