"""A light probe in its own process: how long a refusal takes, seen by a client that is not busy.

    python scripts/reliability/probe.py URL RATE DURATION_S BODY_JSON   # JSON lines on stdout

The overload driver's own client runs hundreds of streams on one event loop; on a 2-core machine
its loop lags, and a 503 it measures includes that lag. This process only sends a request every
1 / RATE seconds (each on its own thread, blocking httpx), notes the time to the status line and
closes the connection at once (a request that was admitted is thereby aborted). One line per
request: {"start_s", "status", "latency_s"}.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx


def probe(url: str, rate: float, duration_s: float, body: dict[str, object]) -> None:
    lock = threading.Lock()
    client = httpx.Client(timeout=30.0, limits=httpx.Limits(max_connections=None))
    t0 = time.perf_counter()

    def one() -> None:
        start = time.perf_counter()
        status: int | None = None
        try:
            with client.stream("POST", url, json=body) as response:
                status = response.status_code
                latency = time.perf_counter() - start
        except httpx.HTTPError:
            latency = time.perf_counter() - start
        with lock:
            print(json.dumps({"start_s": start - t0, "status": status, "latency_s": latency}), flush=True)

    threads = []
    for index in range(int(rate * duration_s)):
        time.sleep(max(0.0, t0 + index / rate - time.perf_counter()))
        thread = threading.Thread(target=one, daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout=60)
    client.close()


if __name__ == "__main__":
    probe(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4]))
