"""What the reliability drivers share: a real `surge serve`, /metrics sampling, RSS, the report.

- `SurgeServer`: `surge serve` as a child process on a free port, its log in a file, ready when
  `/ready` answers 200; `rss_bytes()` sums VmRSS of its pid and every descendant (the engine
  child), read from /proc.
- `MetricsSampler`: scrapes `/metrics` on a timer while load runs: the queue and running gauges,
  the degradation level, counters, each sample stamped with the time since the run started.
- `Criterion` and `render_report`: a markdown report with one pass/fail line per criterion; a
  driver's `main` exits 1 when any fails.
Only HTTP and /proc: nothing here imports the engine or torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def on_an_idle_thread(work: Callable[[], T], *, idle: bool = True) -> T:
    """Run `work` on a thread of its own under SCHED_IDLE (when `idle`) and return its result.

    The load generator stands for clients on other machines. On a 2-core box it would otherwise
    take CPU from the server it measures: the engine process keeps one core busy, the server and
    the generator share the other, and the kernel's load balancing moves whatever is runnable
    onto the engine's core too. SCHED_IDLE runs the generator only on CPU time that nothing else
    wants. At nice 10, as before, the generator still took 10% of the engine's core under
    overload (engine 0.98 cores at capacity, 0.88 at 3x; goodput 86-92%); under SCHED_IDLE the
    engine kept 0.98 and goodput was 100%. Scheduling policies are per thread on Linux:
    processes started before (the server, the probe) keep theirs; processes `work` starts
    inherit this one.
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            if idle:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
            outcome.append(work())
        except BaseException as exc:  # re-raised on the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="load-generator")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------------------- the server


@dataclass
class SurgeServer:
    proc: subprocess.Popen[bytes]
    url: str  # http://127.0.0.1:PORT
    log_path: Path

    @property
    def api(self) -> str:
        return f"{self.url}/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pids(self) -> list[int]:
        """The server and all its descendants (the engine child), from /proc."""
        return [self.pid, *descendants(self.pid)]

    def rss_bytes(self) -> int:
        return sum(vm_rss_bytes(pid) for pid in self.pids())


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name (2nd field) may hold spaces and parentheses: split after the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def vm_rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@contextlib.contextmanager
def surge_server(
    model: str,
    log_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 180.0,
) -> Iterator[SurgeServer]:
    """`surge serve --model MODEL ARGS` on a free port; stopped with SIGTERM (then SIGKILL) at the end."""
    port = free_port()
    # The server's settings come from the arguments only, not from a SURGE_* left in the shell.
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SURGE_")}
    full_env = {**base_env, "SURGE_PORT": str(port), **(env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--model", model, *args],
            cwd=REPO_ROOT,
            env=full_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server = SurgeServer(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{server.url}/ready", timeout=5.0).status_code == 200:
                    break
            if proc.poll() is not None:
                raise RuntimeError("surge serve exited during start-up:\n" + server.log()[-3000:])
            if time.monotonic() > deadline:
                raise RuntimeError("surge serve never became ready:\n" + server.log()[-3000:])
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------------------------- /metrics


def parse_metrics(text: str) -> dict[str, float]:
    """`family{labels}` (and bare `family`) -> value; also each family's sum under its bare name."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        try:
            number = float(value)
        except ValueError:
            continue
        values[name_labels] = number
        family = name_labels.partition("{")[0]
        if family != name_labels:
            values[family] = values.get(family, 0.0) + number
    return values


def labelled(metrics: dict[str, float], family: str, **labels: str) -> float:
    """Sum of `family` over the label sets that include every given label."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    total = 0.0
    for name, value in metrics.items():
        if name.startswith(family + "{") and all(label in name for label in wanted):
            total += value
    return total


async def scrape(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    response = await client.get(f"{base_url}/metrics", timeout=10.0)
    response.raise_for_status()
    return parse_metrics(response.text)


@dataclass(frozen=True, slots=True)
class Sample:
    t_s: float  # since the run started
    waiting: float
    running: float
    level: float
    metrics: dict[str, float]


@dataclass
class MetricsSampler:
    """Scrapes /metrics every `interval_s` from `start()` until `stop()`."""

    base_url: str
    interval_s: float = 0.25
    t0: float = field(default_factory=time.perf_counter)
    samples: list[Sample] = field(default_factory=list)
    num_failed: int = 0
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def sample_once(self, client: httpx.AsyncClient) -> Sample:
        metrics = await scrape(client, self.base_url)
        sample = Sample(
            time.perf_counter() - self.t0,
            metrics.get("surge_requests_waiting", 0.0),
            metrics.get("surge_requests_running", 0.0),
            metrics.get("surge_degradation_level", 0.0),
            metrics,
        )
        self.samples.append(sample)
        return sample

    async def _run(self) -> None:
        async with httpx.AsyncClient() as client:
            while True:
                try:
                    await self.sample_once(client)
                except httpx.HTTPError:
                    self.num_failed += 1
                await asyncio.sleep(self.interval_s)


def level_steps(samples: list[Sample]) -> list[tuple[float, int]]:
    """(time, level) at the first sample and at every change of the degradation level."""
    steps: list[tuple[float, int]] = []
    for sample in samples:
        if not steps or int(sample.level) != steps[-1][1]:
            steps.append((sample.t_s, int(sample.level)))
    return steps


def render_steps(steps: list[tuple[float, int]]) -> str:
    return ", ".join(f"{level} at {t:.1f} s" for t, level in steps) or "no samples"


# ---------------------------------------------------------------------------------- the report


@dataclass(frozen=True, slots=True)
class Criterion:
    name: str
    target: str
    measured: str
    passed: bool


def machine_line() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs ({model}), Python {platform.python_version()}"
    )


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def render_report(title: str, context: list[str], criteria: list[Criterion], sections: list[str]) -> str:
    lines = [f"## {title}", "", *context, "", "| criterion | target | measured | result |", "|---|---|---|---|"]
    lines += [f"| {c.name} | {c.target} | {c.measured} | {'pass' if c.passed else 'FAIL'} |" for c in criteria]
    verdict = "PASS" if all(c.passed for c in criteria) else "FAIL"
    lines += ["", f"**{verdict}**: {sum(c.passed for c in criteria)} of {len(criteria)} criteria met."]
    for section in sections:
        lines += ["", section.rstrip()]
    return "\n".join(lines) + "\n"


def write_report(report: str, out: Path | None) -> None:
    print(report, end="", flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)


# ---------------------------------------------------------------------------------- one request


@dataclass
class Attempt:
    """One HTTP attempt at POST /v1/chat/completions, as the client saw it."""

    start_s: float  # since the run started
    status: int | None = None  # None: no response (connection error, timeout, cancelled)
    error: str | None = None  # None when it succeeded; else the status ("503") or a kind
    status_s: float | None = None  # request start -> response status line and headers
    end_s: float | None = None  # since the run started
    completion_tokens: int = 0
    prompt_tokens: int = 0
    level: int = 0  # x-surge-degraded
    is_replayed: bool = False  # Idempotent-Replayed: true
    headers: dict[str, str] = field(default_factory=dict)
    detail: str = ""  # the body of a refusal (its first 500 characters)

    @property
    def is_ok(self) -> bool:
        return self.error is None


async def chat_once(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, object],
    t0: float,
    headers: dict[str, str] | None = None,
    max_chunks: int | None = None,
) -> Attempt:
    """Send `body` once; read the SSE stream (or JSON) to the end, or stop after `max_chunks`
    content chunks and close the connection (a deliberate disconnect: error "disconnected")."""
    start = time.perf_counter()
    attempt = Attempt(start_s=start - t0)
    try:
        async with client.stream("POST", url, json=body, headers=headers or {}) as response:
            attempt.status = response.status_code
            attempt.status_s = time.perf_counter() - start
            attempt.level = int(response.headers.get("x-surge-degraded", "0"))
            attempt.is_replayed = response.headers.get("idempotent-replayed") == "true"
            attempt.headers = dict(response.headers)
            if response.status_code != 200:
                attempt.detail = (await response.aread()).decode(errors="replace")[:500]
                attempt.error = str(response.status_code)
            elif body.get("stream"):
                await _read_stream(response, attempt, max_chunks)
            else:
                usage = json.loads(await response.aread()).get("usage") or {}
                attempt.completion_tokens = int(usage.get("completion_tokens", 0))
                attempt.prompt_tokens = int(usage.get("prompt_tokens", 0))
    except httpx.TimeoutException:
        attempt.error = "timeout"
    except httpx.TransportError as exc:
        attempt.error, attempt.detail = "connect", f"{type(exc).__name__}: {exc}"
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        attempt.error = "invalid"
    attempt.end_s = time.perf_counter() - t0
    return attempt


async def _read_stream(response: httpx.Response, attempt: Attempt, max_chunks: int | None) -> None:
    num_chunks, finish_reason = 0, None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # separators and keep-alive comments
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            attempt.error = "stream-error"  # an error event after the stream opened
            return
        if chunk.get("usage"):
            attempt.completion_tokens = int(chunk["usage"]["completion_tokens"])
            attempt.prompt_tokens = int(chunk["usage"]["prompt_tokens"])
        for choice in chunk.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                num_chunks += 1
            finish_reason = choice.get("finish_reason") or finish_reason
        if max_chunks is not None and num_chunks >= max_chunks:
            attempt.error = "disconnected"  # leaving the `async with` closes the connection
            return
    if finish_reason is None:
        attempt.error = "stream-cut"  # ended without a finish_reason


def chat_body(model: str, prompt: str, max_tokens: int, *, is_streaming: bool = True) -> dict[str, object]:
    """The fixed request shape of the drivers: greedy, exactly max_tokens (ignore_eos)."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if is_streaming:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def served_model(base_url: str) -> str:
    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.get(f"{base_url}/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` so far (0 when it is gone), from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuMeter:
    """CPU cores used by the server, its engine child and this client between `start` and `stop`."""

    server: SurgeServer
    _start: dict[str, float] = field(default_factory=dict)
    _t0: float = 0.0
    cores: dict[str, float] = field(default_factory=dict)

    def _read(self) -> dict[str, float]:
        pids = self.server.pids()
        return {
            "server": cpu_seconds(pids[0]),
            "engine": sum(cpu_seconds(pid) for pid in pids[1:]),
            "load client": cpu_seconds(os.getpid()),
        }

    def start(self) -> None:
        self._start, self._t0 = self._read(), time.perf_counter()

    def stop(self) -> dict[str, float]:
        end, span = self._read(), time.perf_counter() - self._t0
        self.cores = {name: (end[name] - self._start[name]) / span for name in end}
        return self.cores

    def render(self) -> str:
        return ", ".join(f"{name} {cores:.2f}" for name, cores in self.cores.items())
