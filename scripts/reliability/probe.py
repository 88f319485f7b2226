"""A light probe in its own process: how long a refusal takes, seen by a client that is not busy.

    python -m scripts.reliability.probe      # then one line on stdin: {"url", "rate", "duration_s", "body"}

The overload driver's own client runs hundreds of streams on one event loop; on a 2-core machine
its loop lags, and a 503 it measures includes that lag. This process only sends a request every
1 / RATE seconds (each on its own thread, blocking httpx), notes the time to the status line and
closes the connection at once (a request that was admitted is thereby aborted). One line per
request on stdout: {"start_s", "status", "latency_s"}. It is started before the load generator
lowers its own CPU priority and waits for its plan on stdin, so it runs at the server's priority.
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
    plan = json.loads(sys.stdin.readline())
    probe(plan["url"], float(plan["rate"]), float(plan["duration_s"]), plan["body"])
