"""What the reliability drivers share beyond the harness (scripts/harness/: the server, its
processes, the chat client): /metrics sampling, CPU meters, the report.

- `MetricsSampler`: scrapes `/metrics` on a timer while load runs: the queue and running gauges,
  the degradation level, counters, each sample stamped with the time since the run started.
- `Criterion` and `render_report`: a markdown report with one pass/fail line per criterion; a
  driver's `main` exits 1 when any fails. A criterion that is not judged (a speed criterion of a
  driver's `--fast` run, in `make test`, where no wall-clock bound is held) is reported with its
  measurement only: the full runs (`make test-reliability`) judge it.
Only HTTP and /proc: nothing here imports the engine or torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from scripts.harness.procs import cpu_seconds
from scripts.harness.servers import ServerProcess

T = TypeVar("T")

# Every driver's surge: no drain delay on SIGTERM. The default 2 s is for a load balancer to notice
# (none is listening here), and no criterion looks at the shutdown; it was 2 s of each run's stop.
NO_DRAIN_ARGS = ("--shutdown-delay-seconds", "0")


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
            # One series per tier: the most degraded tier's (the bare name is their sum).
            max((v for k, v in metrics.items() if k.startswith("surge_degradation_level{")), default=0.0),
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
    is_judged: bool = True

    @property
    def result(self) -> str:
        if not self.is_judged:
            return "reported"
        return "pass" if self.passed else "FAIL"


def all_passed(criteria: list[Criterion]) -> bool:
    return all(c.passed for c in criteria if c.is_judged)


def render_report(title: str, context: list[str], criteria: list[Criterion], sections: list[str]) -> str:
    lines = [f"## {title}", "", *context, "", "| criterion | target | measured | result |", "|---|---|---|---|"]
    lines += [f"| {c.name} | {c.target} | {c.measured} | {c.result} |" for c in criteria]
    judged = [c for c in criteria if c.is_judged]
    verdict = "PASS" if all_passed(criteria) else "FAIL"
    lines += ["", f"**{verdict}**: {sum(c.passed for c in judged)} of {len(judged)} criteria met."]
    if len(judged) < len(criteria):
        lines += [f"{len(criteria) - len(judged)} speed criteria reported, not judged (a `--fast` run)."]
    for section in sections:
        lines += ["", section.rstrip()]
    return "\n".join(lines) + "\n"


def write_report(report: str, out: Path | None) -> None:
    print(report, end="", flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)


# ---------------------------------------------------------------------------------- one request


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


@dataclass
class CpuMeter:
    """CPU cores used by the server, its engine child and this client between `start` and `stop`."""

    server: ServerProcess
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
