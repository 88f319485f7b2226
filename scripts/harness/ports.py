"""A free TCP port on loopback, for servers started as subprocesses."""

from __future__ import annotations

import socket


def free_port() -> int:
    # NOTE: the port is free when this returns; a subprocess binds it a moment later. Fine on a
    # test or bench machine; in-process servers take a bound socket instead (tests/live_server.py).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
