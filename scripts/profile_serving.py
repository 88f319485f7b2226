"""Where surge's CPU goes while it serves the benchmark's load: py-spy on both of its processes.

    .venv/bin/python -m scripts.profile_serving                    # m model, 32 streams, 20 s
    .venv/bin/python -m scripts.profile_serving --concurrency 64 --out docs/bench/profile-m-64.md

A fresh `surge serve --model tiny` (the m model); `scripts/bench.py`'s closed-loop client (N
streaming chats, ~32-token prompts, 64 new tokens, greedy, ignore_eos) runs until `--seconds`
after a warm-up; meanwhile `py-spy record --nonblocking` samples the HTTP process and the engine
process. The report gives the CPU cores each process used over the window (the load client's and
py-spy's too: on a small machine they share the server's cores) and, per process, the functions
that were on CPU: by self time (the frame at the top of the stack) and by inclusive time for
surge's own functions. py-spy leaves idle threads out, so a process's samples are its busy time.

Needs py-spy (the `bench` extra has it); Linux only (ptrace and /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from scripts.benchkit.load import LoadSpec, run_load
from scripts.harness.procs import cpu_seconds, machine_line
from scripts.harness.servers import surge_server
from scripts.reliability.common import CpuMeter, labelled, scrape

CHAT = "/v1/chat/completions"
OWN_CODE = ("(app/", "(models/", "(middleware/")  # frames of these files are surge's own (paths as _short gives)


@dataclass
class Target:
    """What scripts/benchkit/load.py needs of a system under test."""

    base_url: str
    model_name: str
    request_extras: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})

    def request_headers(self) -> dict[str, str]:
        return {}


@dataclass
class Profile:
    """One process's py-spy samples, as collapsed stacks."""

    name: str
    stacks: collections.Counter[tuple[str, ...]]

    @property
    def num_samples(self) -> int:
        return sum(self.stacks.values())

    def self_time(self) -> list[tuple[str, int]]:
        leaves: collections.Counter[str] = collections.Counter()
        for frames, count in self.stacks.items():
            leaves[frames[-1]] += count
        return leaves.most_common()

    def inclusive_own(self) -> list[tuple[str, int]]:
        """Samples in which each of surge's own functions is on the stack (once per sample, whatever the line)."""
        totals: collections.Counter[str] = collections.Counter()
        for frames, count in self.stacks.items():
            for function in {re.sub(r":\d+\)$", ")", f) for f in frames if any(part in f for part in OWN_CODE)}:
                totals[function] += count
        return totals.most_common()


def read_collapsed(path: Path, name: str) -> Profile:
    """py-spy's `--format raw`: `frame;frame;...;frame COUNT` per line, the root first."""
    stacks: collections.Counter[tuple[str, ...]] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(_short(frame) for frame in stack.split(";"))] += int(count)
    return Profile(name, stacks)


def _short(frame: str) -> str:
    """`step (/src/surge/models/engine/core.py:120)` -> `step (models/engine/core.py:120)`; site-packages trimmed."""
    for marker in ("site-packages/", str(Path(__file__).resolve().parents[1]) + "/"):
        if marker in frame:
            head, _, tail = frame.partition("(")
            return f"{head}({tail.split(marker, 1)[1]}"
    return frame


def render_profile(profile: Profile, cores: float, top: int) -> list[str]:
    total = profile.num_samples or 1
    lines = [f"### {profile.name} process: {cores:.2f} cores, {profile.num_samples} samples", ""]
    lines += ["Self time (the function on CPU):", "", "| % | function |", "|---|---|"]
    lines += [f"| {100 * n / total:.1f} | `{frame}` |" for frame, n in profile.self_time()[:top]]
    lines += ["", "Inclusive time of surge's own functions:", "", "| % | function |", "|---|---|"]
    lines += [f"| {100 * n / total:.1f} | `{frame}` |" for frame, n in profile.inclusive_own()[:top]]
    return [*lines, ""]


def spy(pid: int, seconds: float, rate: int, out: Path) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    argv = [py_spy, "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(int(seconds))]
    argv += ["--format", "raw", "--nonblocking", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--model", default="tiny", help="tiny (the m model) or echo (no forward pass)")
    parser.add_argument(
        "--max-tokens", type=int, default=64, help="new tokens per request; 1 makes the per-request path the load"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the profiled window")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--server-arg", action="append", default=[], help="extra `surge serve` argument")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="surge-profile-"))
    argv_server = ("--served-model-name", "tiny", "--max-num-seqs", str(args.concurrency), *args.server_arg)
    with surge_server(args.model, work / "server.log", *argv_server) as server:
        target = Target(server.url, "tiny")
        warm = LoadSpec(args.concurrency, 1, args.max_tokens, 8)
        asyncio.run(run_load(target, warm))  # compiled paths, full slots, filled allocator pools
        # The busiest descendant: multiprocessing may start a resource tracker beside the engine.
        engine_pid = max(server.pids()[1:], key=cpu_seconds)
        # Enough requests per client to outlast the window; the window is what is measured.
        spec = LoadSpec(args.concurrency, 100_000, args.max_tokens, 8, seed=1)

        async def answered() -> float:
            async with httpx.AsyncClient() as client:
                return labelled(await scrape(client, server.url), "http_requests_total", handler=CHAT)

        async def measure() -> tuple[dict[str, float], float, float]:
            meter = CpuMeter(server)
            load = asyncio.create_task(run_load(target, spec))
            await asyncio.sleep(2.0)  # the loop is in its steady state
            spies = [spy(pid, args.seconds, args.rate, work / f"{name}.txt") for name, pid in
                     (("server", server.pid), ("engine", engine_pid))]  # fmt: skip
            meter.start()
            before = await answered()
            await asyncio.sleep(args.seconds)
            cores = meter.stop()
            rate = (await answered() - before) / args.seconds
            spy_cpu = sum(cpu_seconds(proc.pid) for proc in spies)  # before they are reaped
            for proc in spies:
                await asyncio.to_thread(proc.wait, 60)
            load.cancel()
            return cores, spy_cpu / args.seconds, rate

        cores, spy_cores, rate = asyncio.run(measure())
    server_profile = read_collapsed(work / "server.txt", "HTTP (server)")
    engine_profile = read_collapsed(work / "engine.txt", "engine")
    lines = [
        f"## Profile: surge serving {args.concurrency} streams",
        "",
        f"Command: `python -m scripts.profile_serving {' '.join(sys.argv[1:] if argv is None else argv)}`",
        f"Machine: {machine_line()}; model {args.model}; {args.max_tokens} new tokens per request; "
        f"{args.seconds:g} s window; py-spy at {args.rate} Hz.",
        f"CPU cores used over the window: {', '.join(f'{k} {v:.2f}' for k, v in cores.items())}, "
        f"py-spy {spy_cores:.2f}; {os.cpu_count()} cores in all. Requests answered: {rate:.1f}/s "
        f"({1000 * cores['server'] / rate if rate else float('nan'):.2f} ms of the HTTP process's CPU each).",
        "",
        *render_profile(server_profile, cores["server"], args.top),
        *render_profile(engine_profile, cores["engine"], args.top),
        f"Raw stacks: {work}",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
