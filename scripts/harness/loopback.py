"""One HTTP client for the many small requests a test or driver sends to servers on loopback:
readiness polls, /metrics scrapes.

`httpx.get` builds a client, and with it an SSL context that parses the CA bundle, on every call:
45 ms of CPU on a 2-core AMD EPYC, so a readiness poll every 50 ms took about half a core from the
server it was waiting for. This client is built once. It keeps no idle connections: a server that
is killed or restarted between two requests must not leave a dead pooled socket for the next one
(a loopback connect costs a fraction of a millisecond).
"""

from __future__ import annotations

import threading

import httpx

_lock = threading.Lock()
_client: httpx.Client | None = None


def loopback() -> httpx.Client:
    """The shared client (thread-safe; 10 s timeout unless a request says otherwise)."""
    global _client
    with _lock:
        if _client is None:
            _client = httpx.Client(timeout=10.0, limits=httpx.Limits(max_keepalive_connections=0))
        return _client
