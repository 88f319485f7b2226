"""What the fault tests (tests/app/test_faults_*.py) share: `surge serve` processes started side by
side, /metrics read as numbers, a process's resident memory, and latency summaries."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.app.surge_process import SurgeProcess
from tests.ports import free_port


def spawn(model: Path | str, log_path: Path, *args: str, env: dict[str, str] | None = None) -> SurgeProcess:
    """Start `surge serve` on a free port without waiting for it (start several, then `wait_ready`).
    `model`: a model directory, or a name `--model` takes (`echo`)."""
    port = free_port()
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--model", str(model), "--port", str(port), *args],
            env={**os.environ, **(env or {})},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    return SurgeProcess(proc, f"http://127.0.0.1:{port}", log_path)


def wait_ready(server: SurgeProcess, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{server.url}/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert server.proc.poll() is None, "surge exited during start-up:\n" + server.log()
        assert time.monotonic() < deadline, "surge never became ready:\n" + server.log()
        time.sleep(0.1)


@contextmanager
def surge_servers(model: Path | str, tmp_dir: Path, *argvs: Sequence[str]) -> Iterator[list[SurgeProcess]]:
    """One `surge serve` per argument list, started together, yielded once all are ready; killed after."""
    servers = [spawn(model, tmp_dir / f"surge-{i}.log", *argv) for i, argv in enumerate(argvs)]
    try:
        for server in servers:
            wait_ready(server)
        yield servers
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait()


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there are none)."""
    return sum(
        value
        for (sample, sample_labels), value in metrics(url).items()
        if sample == name and all((k, v) in sample_labels for k, v in labels.items())
    )


IDLE_GAUGES = ("surge_requests_running", "surge_requests_waiting", "surge_kv_cache_usage_ratio")


def wait_idle(url: str, timeout: float = 15.0) -> None:
    """Until running, waiting and KV use are all 0 on /metrics (fails the test if never)."""
    deadline = time.monotonic() + timeout
    while True:
        levels = {name: metric(url, name) for name in IDLE_GAUGES}
        if not any(levels.values()):
            return
        assert time.monotonic() < deadline, f"not idle after {timeout:.0f} s: {levels}"
        time.sleep(0.05)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc/<pid>/status (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary_ms(values: Sequence[float]) -> str:
    """p50 / p90 / max in milliseconds, for the printed figures (`pytest -s` shows them)."""
    if not values:
        return "no samples"
    return (
        f"n={len(values)} p50={statistics.median(values) * 1000:.1f} ms "
        f"p90={percentile(values, 0.9) * 1000:.1f} ms max={max(values) * 1000:.1f} ms"
    )
