"""Soak: minutes of mixed load, and what is left behind: memory, errors, busy gauges.

    .venv/bin/python -m scripts.reliability.soak                 # full: 20 minutes after warm-up
    .venv/bin/python -m scripts.reliability.soak --fast          # ~20 s (tests/scripts)

`users` closed-loop clients, each picking its next request from a mix: streamed, JSON, an
idempotent request and its retry with the same `Idempotency-Key` (at once, which may get a 409
first, or after it ended: a replay), an exact duplicate of a recent greedy request (the dedup
cache), a stream the client closes after a few chunks, and a JSON request the client gives up on.
The server runs with `SURGE_TRACEMALLOC=1` (app/ops/diagnostics.py): SIGUSR1 to the server and its
engine process writes their top allocation sites after warm-up and at the end. The idempotency
and dedup TTLs are shortened, and the prefix cache bounded small, so the three caches reach their
steady size within the warm-up.

Criteria: RSS of the server and its engine child (VmRSS from /proc) grows < 5% from the end of
warm-up to the end; no unexpected outcome (client side: anything but the deliberate disconnects
and 409s of concurrent retries; server side: no ERROR line or traceback in the log); the mix
reached every path (replays, dedup hits, aborts, prefix-cache evictions); surge_requests_running and
surge_requests_waiting back to 0 once the load ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from scripts.harness.chat import ChatAttempt, send_chat
from scripts.harness.procs import load_average, machine_line, rss_bytes
from scripts.harness.servers import ServerProcess, surge_server
from scripts.loadtest.workload import WORD_POOL
from scripts.reliability.common import (
    NO_DRAIN_ARGS,
    Criterion,
    all_passed,
    chat_body,
    render_report,
    scrape,
    served_model,
    write_report,
)

# Weights of the mix; each user draws its next scenario from them.
MIX = {
    "stream": 3,
    "json": 2,
    "idempotent-retry": 1,  # the retry after the first ended: a replay
    "idempotent-concurrent": 1,  # the retry while the first runs: 409, then a replay
    "duplicate": 2,
    "disconnect-stream": 1,
    "disconnect-json": 1,
}
# What each scenario's attempts may end in besides success.
EXPECTED_ERRORS = {"disconnect-stream": {"disconnected"}, "disconnect-json": {"timeout"}}
LOG_PROBLEM = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback \(most recent call last\)")
DUMP_HEADER = re.compile(r"^# surge tracemalloc dump (\d+) ", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class SoakConfig:
    model: str = "tiny"
    duration_s: float = 1200.0  # after warm-up
    warmup_s: float = 60.0
    users: int = 8
    max_num_seqs: int = 16
    prompt_words: tuple[int, int] = (4, 24)
    max_tokens: tuple[int, int] = (8, 48)
    cache_ttl_s: float = 30.0  # idempotency and dedup
    # Small enough that the prefix cache is full and evicting by the end of the warm-up: its K/V is
    # held memory by design (pages of its own mapping, faulted in as blocks are first kept), and a
    # cache still filling reads as RSS growth (14 of the 28 MiB a fast soak grew at the default bound).
    prefix_cache_size: str = "4MiB"
    rss_interval_s: float = 10.0
    idle_timeout_s: float = 60.0
    seed: int = 0
    max_rss_growth: float = 0.05
    top_sites: int = 8


PREFIX_HELD = "surge_prefix_cache_used_bytes"

FAST = SoakConfig(duration_s=12.0, warmup_s=5.0, users=6, max_num_seqs=8, cache_ttl_s=2.0, rss_interval_s=1.0)


@dataclass
class Outcome:
    scenario: str
    attempts: list[ChatAttempt]
    finals: list[ChatAttempt] = field(default_factory=list)  # each client's last attempt; default: the last

    def __post_init__(self) -> None:
        if not self.finals:
            self.finals = self.attempts[-1:]

    def unexpected(self) -> list[str]:
        allowed = EXPECTED_ERRORS.get(self.scenario, set())
        bad = []
        for attempt in self.attempts:
            if attempt.error is None or attempt.error in allowed:
                continue
            # A 409 is the answer to a retry while the first still runs; it is retried.
            is_final = any(attempt is final for final in self.finals)
            if self.scenario.startswith("idempotent") and attempt.error == "409" and not is_final:
                continue
            bad.append(f"{self.scenario}: {attempt.error} {attempt.detail[:120]}".strip())
        if self.scenario.startswith("idempotent") and all(a.is_ok for a in self.finals):
            num_ran = sum(1 for a in self.finals if not a.is_replayed)
            if num_ran != 1:
                bad.append(f"{self.scenario}: {num_ran} of {len(self.finals)} clients ran the model (1 expected)")
        return bad


@dataclass
class SoakRun:
    config: SoakConfig
    outcomes: list[Outcome]
    rss: list[tuple[float, int]]  # (seconds since warm-up ended, bytes)
    rss_by_pid_start: dict[int, int]
    rss_by_pid_end: dict[int, int]
    counters_start: dict[str, float]
    counters_end: dict[str, float]
    idle: dict[str, float]  # gauges once the load ended
    idle_after_s: float
    dumps_start: dict[str, str]  # role -> dump text
    dumps_end: dict[str, str]
    log_problems: list[str]
    load_averages: list[str] = field(default_factory=list)


class Mix:
    """The requests of one soak run: prompts, recent greedy bodies for duplicates."""

    def __init__(self, config: SoakConfig, model: str, seed: int) -> None:
        self.config = config
        self.model = model
        self.rng = random.Random(seed)
        self.run_id = uuid.uuid4().hex[:8]
        self.serial = 0
        self.recent: list[dict[str, object]] = []

    def body(self, *, is_streaming: bool, max_tokens: int | None = None) -> dict[str, object]:
        rng, config = self.rng, self.config
        self.serial += 1
        words = rng.choices(WORD_POOL, k=rng.randint(*config.prompt_words))
        prompt = " ".join([f"{self.run_id}-{self.serial}:", *words])
        body = chat_body(self.model, prompt, max_tokens or rng.randint(*config.max_tokens), is_streaming=is_streaming)
        self.recent = [*self.recent[-19:], body]
        return body

    def scenario(self) -> str:
        return self.rng.choices(list(MIX), weights=list(MIX.values()))[0]


async def run_scenario(client: httpx.AsyncClient, url: str, mix: Mix, scenario: str, t0: float) -> Outcome:
    rng = mix.rng
    if scenario in ("stream", "json"):
        return Outcome(scenario, [await send_chat(client, url, mix.body(is_streaming=scenario == "stream"), t0=t0)])
    if scenario == "duplicate":
        body = dict(rng.choice(mix.recent)) if mix.recent else mix.body(is_streaming=True)
        return Outcome(scenario, [await send_chat(client, url, body, t0=t0)])
    if scenario == "disconnect-stream":
        body = mix.body(is_streaming=True, max_tokens=mix.config.max_tokens[1])
        return Outcome(scenario, [await send_chat(client, url, body, t0=t0, max_chunks=rng.randint(1, 4))])
    if scenario == "disconnect-json":
        body = mix.body(is_streaming=False, max_tokens=mix.config.max_tokens[1])
        timeout = httpx.Timeout(120.0, read=rng.uniform(0.02, 0.2))  # gives up before the reply
        async with httpx.AsyncClient(timeout=timeout) as impatient:
            return Outcome(scenario, [await send_chat(impatient, url, body, t0=t0)])
    # Idempotent: the same key on every attempt; exactly one client runs the model, the other replays.
    body = mix.body(is_streaming=rng.random() < 0.5)
    headers = {"Idempotency-Key": f"soak-{uuid.uuid4()}"}

    async def until_not_409(delay_s: float) -> list[ChatAttempt]:
        await asyncio.sleep(delay_s)
        attempts = [await send_chat(client, url, body, t0=t0, headers=headers)]
        while attempts[-1].error == "409" and len(attempts) < 30:
            await asyncio.sleep(float(attempts[-1].headers.get("retry-after", "1")))
            attempts.append(await send_chat(client, url, body, t0=t0, headers=headers))
        return attempts

    if scenario == "idempotent-retry":
        chains = [await until_not_409(0.0), await until_not_409(0.0)]
    else:
        chains = list(await asyncio.gather(until_not_409(0.0), until_not_409(0.01)))
    return Outcome(scenario, [a for chain in chains for a in chain], [chain[-1] for chain in chains])


def read_dump(path: Path, number: int, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            text = path.read_text()
            match = DUMP_HEADER.search(text)
            if match and int(match.group(1)) >= number:
                return text
        time.sleep(0.1)
    return f"(no dump {number} at {path} after {timeout_s:g} s)"


TRACED = re.compile(r"SIGUSR1 writes (\S*surge-tracemalloc-(server|engine)-(\d+)\.txt)")


async def dump_tracemalloc(server: ServerProcess, number: int) -> dict[str, str]:
    """SIGUSR1 to each process that logged it traces (the server and its engine child; never
    another child such as multiprocessing's resource tracker, whom SIGUSR1 would kill); their
    dumps by role."""
    dumps = {}
    for path, role, pid in TRACED.findall(server.log()):
        os.kill(int(pid), signal.SIGUSR1)
        dumps[role] = await asyncio.to_thread(read_dump, Path(path), number)
    return dumps


def rss_by_pid(server: ServerProcess) -> dict[int, int]:
    return {pid: rss_bytes(pid) for pid in server.pids()}


async def wait_idle(client: httpx.AsyncClient, base_url: str, timeout_s: float) -> tuple[dict[str, float], float]:
    start = time.perf_counter()
    while True:
        metrics = await scrape(client, base_url)
        gauges = {
            name: metrics.get(name, -1.0)
            for name in ("surge_requests_running", "surge_requests_waiting", "surge_kv_cache_usage_ratio")
        }
        if all(value == 0 for value in gauges.values()) or time.perf_counter() - start > timeout_s:
            return gauges, time.perf_counter() - start
        await asyncio.sleep(0.2)


async def drive(config: SoakConfig, server: ServerProcess) -> SoakRun:
    model = await served_model(server.url)
    url = f"{server.api}/chat/completions"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    outcomes: list[Outcome] = []
    rss: list[tuple[float, int]] = []
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:
        t0 = time.perf_counter()
        load_end = config.warmup_s + config.duration_s
        mixes = [Mix(config, model, config.seed * 1000 + user) for user in range(config.users)]

        async def user(mix: Mix) -> None:
            while time.perf_counter() - t0 < load_end:
                outcome = await run_scenario(client, url, mix, mix.scenario(), t0)
                if time.perf_counter() - t0 >= config.warmup_s:
                    outcomes.append(outcome)

        users = asyncio.gather(*(user(mix) for mix in mixes))
        await asyncio.sleep(config.warmup_s)
        # The baseline: right after warm-up, under the same load as the end.
        counters_start = await scrape(client, server.url)
        dumps_start = await dump_tracemalloc(server, 1)
        rss_start = rss_by_pid(server)
        warm_at = time.perf_counter()
        rss.append((0.0, sum(rss_start.values())))
        while time.perf_counter() - t0 < load_end:
            await asyncio.sleep(min(config.rss_interval_s, max(0.0, load_end - (time.perf_counter() - t0))))
            rss.append((time.perf_counter() - warm_at, server.rss_bytes()))
        rss_end_loaded = rss_by_pid(server)
        await users
        idle, idle_after = await wait_idle(client, server.url, config.idle_timeout_s)
        counters_end = await scrape(client, server.url)
        dumps_end = await dump_tracemalloc(server, 2)
    problems = [line for line in server.log().splitlines() if LOG_PROBLEM.search(line)]
    return SoakRun(
        config,
        outcomes,
        rss,
        rss_start,
        rss_end_loaded,
        counters_start,
        counters_end,
        idle,
        idle_after,
        dumps_start,
        dumps_end,
        problems,
    )


def evaluate(run: SoakRun) -> list[Criterion]:
    config = run.config
    start, end = sum(run.rss_by_pid_start.values()), sum(run.rss_by_pid_end.values())
    growth = (end - start) / start if start else float("inf")
    unexpected = [problem for outcome in run.outcomes for problem in outcome.unexpected()]

    def delta(name: str) -> float:
        return run.counters_end.get(name, 0.0) - run.counters_start.get(name, 0.0)

    paths = {
        "idempotent replays": delta("surge_idempotent_replays_total"),
        "dedup hits": delta("surge_dedup_hits_total"),
        "aborts": delta("surge_requests_aborted_total"),
        "prefix-cache evictions": delta("surge_prefix_cache_evicted_blocks_total"),
    }
    return [
        Criterion(
            "RSS growth after warm-up (server + engine child)",
            f"< {config.max_rss_growth:.0%}",
            f"{start / 2**20:.1f} -> {end / 2**20:.1f} MiB ({growth:+.2%})",
            growth < config.max_rss_growth,
        ),
        Criterion(
            "no unexpected client outcome",
            "0 (deliberate disconnects and 409s of concurrent retries expected)",
            f"{len(unexpected)} of {len(run.outcomes)} requests"
            + (f": {'; '.join(unexpected[:3])}" if unexpected else ""),
            not unexpected and bool(run.outcomes),
        ),
        Criterion(
            "no error in the server log",
            "no ERROR/CRITICAL line, no traceback",
            f"{len(run.log_problems)} lines" + (f": {run.log_problems[0][:160]}" if run.log_problems else ""),
            not run.log_problems,
        ),
        Criterion(
            "the mix reached every path",
            "replays, dedup hits, aborts and prefix-cache evictions > 0",
            ", ".join(f"{name} {value:.0f}" for name, value in paths.items()),
            all(value > 0 for value in paths.values()),
        ),
        Criterion(
            "gauges back to idle after the load",
            "running = waiting = KV usage = 0",
            ", ".join(f"{name.removeprefix('surge_')} {value:g}" for name, value in run.idle.items())
            + f" ({run.idle_after_s:.1f} s after the last request)",
            all(value == 0 for value in run.idle.values()),
        ),
    ]


def top_lines(dump: str, section: str, count: int) -> list[str]:
    """The first `count` lines of a dump's section whose title starts with `section`."""
    lines = dump.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(f"## {section}"):
            body = [entry.strip() for entry in lines[index + 1 :] if entry.strip()]
            body = body[: next((i for i, entry in enumerate(body) if entry.startswith("##")), len(body))]
            return [_shorten(entry) for entry in body[:count]]
    return [dump.splitlines()[0] if dump else "(empty)"]


def _shorten(entry: str) -> str:
    """Paths from site-packages and the repo without their prefixes."""
    entry = re.sub(r"\S*/site-packages/", "", entry)
    return entry.replace(str(Path(__file__).resolve().parents[2]) + "/", "")


def render(run: SoakRun, criteria: list[Criterion], command: str) -> str:
    config = run.config
    scenarios = Counter(outcome.scenario for outcome in run.outcomes)
    outcomes = Counter(
        attempt.error or ("ok (replayed)" if attempt.is_replayed else "ok")
        for outcome in run.outcomes
        for attempt in outcome.attempts
    )
    num_attempts = sum(len(outcome.attempts) for outcome in run.outcomes)
    context = [
        f"Command: `{command}`",
        f"Machine: {machine_line()}; load average (1/5/15 min) {' -> '.join(run.load_averages)}.",
        f"Server: `SURGE_TRACEMALLOC=1 surge serve --model {config.model} --max-num-seqs {config.max_num_seqs} "
        f"--idempotency-ttl-seconds {config.cache_ttl_s:g} --dedup-ttl-seconds {config.cache_ttl_s:g} "
        f"--prefix-cache-size {config.prefix_cache_size}`.",
        f"Load: {config.users} closed-loop users, {config.warmup_s:g} s warm-up, then {config.duration_s:g} s "
        f"measured: {len(run.outcomes)} logical requests, {num_attempts} HTTP attempts.",
        f"Mix: {', '.join(f'{name} {n}' for name, n in sorted(scenarios.items()))}.",
        f"Attempts by outcome: {', '.join(f'{name} {n}' for name, n in sorted(outcomes.items()))}.",
        "RSS (MiB) by pid after warm-up / at the end: "
        + ", ".join(
            f"{pid}: {run.rss_by_pid_start.get(pid, 0) / 2**20:.1f} / {run.rss_by_pid_end.get(pid, 0) / 2**20:.1f}"
            for pid in sorted(set(run.rss_by_pid_start) | set(run.rss_by_pid_end))
        )
        + "; total over time: "
        + ", ".join(f"{t:.0f} s {b / 2**20:.1f}" for t, b in _spread(run.rss, 8))
        + ".",
        "Prefix cache K/V held (MiB) after warm-up / at the end: "
        + " / ".join(
            f"{counters.get(PREFIX_HELD, 0.0) / 2**20:.1f}" for counters in (run.counters_start, run.counters_end)
        )
        + ".",
    ]
    sections = []
    for role in ("server", "engine"):
        start, end = run.dumps_start.get(role, ""), run.dumps_end.get(role, "")
        lines = [f"tracemalloc, {role} process: top {config.top_sites} sites after warm-up:", "```"]
        lines += top_lines(start, "top", config.top_sites)
        lines += ["```", "at the end:", "```", *top_lines(end, "top", config.top_sites), "```"]
        lines += [
            "growth since warm-up:",
            "```",
            *top_lines(end, "top 15 allocation sites by growth", config.top_sites),
        ]
        lines += ["```"]
        sections.append("\n".join(lines))
    return render_report("Soak", context, criteria, sections)


def _spread(points: list[tuple[float, int]], count: int) -> list[tuple[float, int]]:
    if len(points) <= count:
        return points
    step = (len(points) - 1) / (count - 1)
    return [points[round(i * step)] for i in range(count)]


async def run_soak(config: SoakConfig, directory: Path) -> SoakRun:
    averages = [load_average()]
    args = [
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--idempotency-ttl-seconds",
        str(config.cache_ttl_s),
        "--dedup-ttl-seconds",
        str(config.cache_ttl_s),
        "--prefix-cache-size",
        config.prefix_cache_size,
        *NO_DRAIN_ARGS,
    ]
    env = {"SURGE_TRACEMALLOC": "1", "SURGE_TRACEMALLOC_DIR": str(directory)}
    with surge_server(config.model, directory / "server.log", *args, env=env) as server:
        run = await drive(config, server)
    averages.append(load_average())
    run.load_averages = averages
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="the seconds-long version (tests)")
    parser.add_argument("--model", default="tiny", help="surge serve --model (default: tiny)")
    parser.add_argument("--minutes", type=float, help="measured minutes after warm-up (full: 20)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--dir", type=Path, help="server log and tracemalloc dumps (default: a temp dir)")
    args = parser.parse_args(argv)
    config = replace(FAST if args.fast else SoakConfig(), model=args.model)
    if args.minutes is not None:
        config = replace(config, duration_s=args.minutes * 60)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="surge-soak-"))
    directory.mkdir(parents=True, exist_ok=True)
    run = asyncio.run(run_soak(config, directory))
    criteria = evaluate(run)
    command = "python -m scripts.reliability.soak " + " ".join(sys.argv[1:] if argv is None else argv)
    write_report(render(run, criteria, command.strip()) + f"\nServer log and dumps: {directory}\n", args.out)
    return 0 if all_passed(criteria) else 1


if __name__ == "__main__":
    raise SystemExit(main())
