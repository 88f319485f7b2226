"""Overload: three times the measured capacity, and what surge does with it.

    .venv/bin/python -m scripts.reliability.overload            # full: 20 s capacity, 60 s at 3x
    .venv/bin/python -m scripts.reliability.overload --fast     # seconds (tests/scripts)

1. Capacity: a closed loop of `max_num_seqs` + `capacity_queue` streaming users (so a request
   always waits for each slot that frees, whatever the client's own lag; 32-token prompts, 32-64
   new tokens, greedy, ignore_eos) against a fresh `surge serve`; completions and tokens per second.
   The full run measures it again at the end (`capacity_after`).
2. Overload: Poisson arrivals at `factor` x that rate for `overload_s` seconds; a share of them
   (`sdk_fraction`) through `openai.AsyncOpenAI` with its default `max_retries=2`, the rest over
   plain httpx with no retries. /metrics is sampled throughout and until the degradation level
   is back to 0.
3. Criteria: the queue within `--max-queued-requests`; every refusal a 503 before the stream
   opened, p99 under 50 ms; goodput (tokens/s of real completions, canned replies excluded) at
   least 90% of the higher capacity measured; the level up under load and down one step per
   cooldown after it; SDK attempts (counted by an httpx hook and by the server's request counter)
   at most 3x its logical requests.
The load generator runs under SCHED_IDLE (common.on_an_idle_thread), the probe and the server at
normal priority. The report is markdown on stdout (and `--out`); exit status 1 when a criterion fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from scripts.harness.chat import ChatAttempt, send_chat
from scripts.harness.procs import load_average, machine_line
from scripts.harness.servers import REPO_ROOT, ServerProcess, surge_server
from scripts.harness.stats import percentile
from scripts.loadtest.workload import WORD_POOL, poisson_arrivals
from scripts.reliability.common import (
    NO_DRAIN_ARGS,
    CpuMeter,
    Criterion,
    MetricsSampler,
    Sample,
    all_passed,
    chat_body,
    labelled,
    level_steps,
    on_an_idle_thread,
    render_report,
    render_steps,
    scrape,
    served_model,
    write_report,
)

CHAT_HANDLER = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class OverloadConfig:
    model: str = "tiny"
    max_num_seqs: int = 32
    max_queued_requests: int = 32
    prompt_words: int = 8  # 27-38 (mean 32) prompt tokens with the tiny tokenizer's chat template
    min_new_tokens: int = 32
    max_new_tokens: int = 64
    capacity_warmup_s: float = 5.0  # not counted: the batch fills up
    capacity_s: float = 20.0
    capacity_queue: int = 8  # closed-loop users beyond max_num_seqs: a queue, so no slot waits on a client
    # Capacity measured again once the level is back to 0; goodput is held against the higher of the
    # two, since the VM's speed drifts +-10-20% from minute to minute and one figure can flatter.
    capacity_after: bool = True
    factor: float = 3.0
    overload_s: float = 60.0
    skip_s: float = 10.0  # of the overload, not counted in goodput: the queue fills up
    sdk_fraction: float = 0.2
    probe_rate: float = 4.0  # requests/s of the separate probe process (scripts/reliability/probe.py)
    client_idle: bool = True  # the load generator under SCHED_IDLE (see common.on_an_idle_thread)
    # The engine's decode threads. SCHED_IDLE gives the generator only the CPU nothing else wants,
    # so the engine must leave it a core: under `--num-threads auto` a 2-core box picked 2 decode
    # threads for the tiny model (5.5 ms a step against 6.4), the generator got 0.05 cores, its
    # Poisson arrivals reached the server at half their rate, and nothing was overloaded.
    # 0: the server's own choice (`auto`).
    engine_threads: int = 1
    extra_server_args: tuple[str, ...] = ()  # --server-arg
    # Degradation: a full queue scores max_queued / queue_depth = 2, i.e. level 2 (clamps and no
    # logprobs, which cost this load nothing); level 3's canned replies would not be goodput.
    degrade_queue_depth: int = 16
    cooldown_s: float = 5.0
    # None: the server's defaults (queue-time and TTFT p90 over a 30 s window also feed the score).
    degrade_queue_seconds: float | None = None
    degrade_ttft_seconds: float | None = None
    settle_timeout_s: float = 120.0  # after the load, for the level to return to 0
    sample_interval_s: float = 0.25
    seed: int = 0
    # Criteria
    max_reject_p99_ms: float = 50.0
    min_goodput_ratio: float = 0.9
    max_attempts_per_request: float = 3.0
    # The two speed criteria above are judged (False: reported only; the --fast run in make test).
    judges_speed: bool = True

    @property
    def capacity_users(self) -> int:
        return self.max_num_seqs + self.capacity_queue

    def server_args(self) -> list[str]:
        args = [
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-queued-requests",
            str(self.max_queued_requests),
            "--degrade-queue-depth",
            str(self.degrade_queue_depth),
            "--degrade-cooldown-seconds",
            str(self.cooldown_s),
        ]
        if self.engine_threads:
            args += ["--num-threads", str(self.engine_threads)]
        if self.degrade_queue_seconds is not None:
            args += ["--degrade-queue-seconds", str(self.degrade_queue_seconds)]
        if self.degrade_ttft_seconds is not None:
            args += ["--degrade-ttft-seconds", str(self.degrade_ttft_seconds)]
        return args + list(NO_DRAIN_ARGS) + list(self.extra_server_args)


# Seconds, not minutes: what `make test` runs. Only queue depth drives the level (the 30 s
# latency windows would keep it up for half a minute after the load), and the speed criteria (503
# latency, goodput) are reported, not judged: the full run holds them.
FAST = OverloadConfig(
    max_num_seqs=8,
    # NOTE: at least the capacity run's users (8 + 2): a request counts as waiting from admission
    # until its dedup flight submits it (a loop turn later), so when the users' streams end together
    # and they all send again in one turn of the server's loop, up to all of them count at once,
    # free slots or not; with a bound below that the capacity run sees a 503 now and then.
    max_queued_requests=10,
    capacity_queue=2,  # below degrade_queue_depth: the capacity run stays at level 0
    capacity_after=False,
    capacity_warmup_s=1.5,
    capacity_s=4.0,
    overload_s=8.0,
    skip_s=2.0,
    degrade_queue_depth=4,
    cooldown_s=1.0,
    degrade_queue_seconds=600.0,
    degrade_ttft_seconds=600.0,
    settle_timeout_s=30.0,
    judges_speed=False,
)


@dataclass
class Logical:
    """One logical request of the overload phase."""

    via: str  # "httpx" or "sdk"
    final: ChatAttempt


@dataclass
class Capacity:
    requests_per_s: float
    tokens_per_s: float
    num_completed: int
    window_s: float
    server_tokens_per_s: float  # surge_generation_tokens_total over the window
    cpu: str = ""  # cores used per process over the window


@dataclass
class OverloadRun:
    config: OverloadConfig
    capacity: Capacity
    offered_rate: float
    logical: list[Logical]
    samples: list[Sample]
    load_start_s: float  # sampler time of the first arrival
    load_end_s: float  # sampler time when the last request ended
    sdk_attempts: int  # counted by the SDK's httpx hook
    sdk_retries: int  # attempts with x-stainless-retry-count > 0
    server_attempts: float  # http_requests_total for the chat route during the overload phase
    probes: list[dict[str, float]]  # the probe process's requests: start_s, status, latency_s
    cpu: str = ""  # cores used per process over the goodput window
    load_averages: list[str] = field(default_factory=list)
    capacity_after: Capacity | None = None  # measured again after the run (config.capacity_after)

    @property
    def reference_tokens_per_s(self) -> float:
        """What goodput is held against: the higher capacity measured."""
        after = self.capacity_after.tokens_per_s if self.capacity_after is not None else 0.0
        return max(self.capacity.tokens_per_s, after)


def _prompt(rng: random.Random, run_id: str, serial: int, words: int) -> str:
    return " ".join([f"{run_id}-{serial}:", *rng.choices(WORD_POOL, k=words)])


async def measure_capacity(config: OverloadConfig, server: ServerProcess, model: str) -> Capacity:
    """A closed loop of max_num_seqs + capacity_queue streaming users; completions in the window
    after warm-up. With exactly max_num_seqs users a slot stays empty while its user is between
    requests, and the generator's own lag would then set the capacity."""
    rng, run_id = random.Random(config.seed), uuid.uuid4().hex[:8]
    url = f"{server.api}/chat/completions"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    t0 = time.perf_counter()
    end_at = config.capacity_warmup_s + config.capacity_s
    done: list[ChatAttempt] = []
    serial = 0
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:

        async def user(index: int) -> None:
            nonlocal serial
            # Users join over the first half of the warm-up, not all at once: a burst of more users
            # than the queue holds would be refused (503) before the first step admitted any.
            await asyncio.sleep(index * config.capacity_warmup_s / (2 * config.capacity_users))
            while time.perf_counter() - t0 < end_at:
                serial += 1
                max_tokens = rng.randint(config.min_new_tokens, config.max_new_tokens)
                body = chat_body(model, _prompt(rng, run_id, serial, config.prompt_words), max_tokens)
                done.append(await send_chat(client, url, body, t0=t0))

        meter = CpuMeter(server)

        async def generated_at(offset_s: float, mark: Callable[[], object]) -> tuple[float, float]:
            await asyncio.sleep(max(0.0, t0 + offset_s - time.perf_counter()))
            mark()
            metrics = await scrape(client, server.url)
            return time.perf_counter(), metrics.get("surge_generation_tokens_total", 0.0)

        marks = asyncio.gather(generated_at(config.capacity_warmup_s, meter.start), generated_at(end_at, meter.stop))
        await asyncio.gather(*(user(index) for index in range(config.capacity_users)))
        (t_start, tokens_start), (t_end, tokens_end) = await marks
    window = [a for a in done if a.is_ok and a.end_s is not None and config.capacity_warmup_s <= a.end_s < end_at]
    failed = [a for a in done if not a.is_ok]
    if failed:
        raise RuntimeError(f"capacity run had {len(failed)} failed requests: {failed[:3]}")
    return Capacity(
        len(window) / config.capacity_s,
        sum(a.completion_tokens for a in window) / config.capacity_s,
        len(window),
        config.capacity_s,
        (tokens_end - tokens_start) / (t_end - t_start),
        meter.render(),
    )


async def drive_overload(
    config: OverloadConfig, server: ServerProcess, model: str, capacity: Capacity, probe: subprocess.Popen[bytes]
) -> OverloadRun:
    import openai  # only the overload phase needs the SDK

    rate = config.factor * capacity.requests_per_s
    rng, run_id = random.Random(config.seed + 1), uuid.uuid4().hex[:8]
    url = f"{server.api}/chat/completions"
    sdk_attempts = sdk_retries = 0

    async def count_attempt(request: httpx.Request) -> None:
        nonlocal sdk_attempts, sdk_retries
        if request.method == "POST":
            sdk_attempts += 1
            sdk_retries += request.headers.get("x-stainless-retry-count", "0") != "0"

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
    sampler = MetricsSampler(server.url, interval_s=config.sample_interval_s)
    async with (
        httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client,
        httpx.AsyncClient(
            limits=limits, timeout=httpx.Timeout(120.0), event_hooks={"request": [count_attempt]}
        ) as sdk_http,
    ):
        sdk = openai.AsyncOpenAI(base_url=server.api, api_key="unused", http_client=sdk_http)  # max_retries=2
        before = await sampler.sample_once(client)
        sampler.start()
        load_start = time.perf_counter() - sampler.t0

        async def via_httpx(body: dict[str, object]) -> Logical:
            return Logical("httpx", await send_chat(client, url, body, t0=sampler.t0))

        async def via_sdk(body: dict[str, object]) -> Logical:
            start = time.perf_counter()
            attempt = ChatAttempt(start_s=start - sampler.t0)
            try:
                raw = await sdk.chat.completions.with_raw_response.create(
                    model=model,
                    messages=body["messages"],
                    max_tokens=body["max_tokens"],
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                attempt.status = raw.status_code
                attempt.level = int(raw.headers.get("x-surge-degraded", "0"))
                async for chunk in raw.parse():
                    if chunk.usage is not None:
                        attempt.completion_tokens = chunk.usage.completion_tokens
            except openai.APIStatusError as exc:
                attempt.status, attempt.error = exc.status_code, str(exc.status_code)
            except openai.APIConnectionError:
                attempt.error = "connect"
            except openai.APIError:
                attempt.error = "stream-error"
            attempt.end_s = time.perf_counter() - sampler.t0
            return Logical("sdk", attempt)

        probe_body = chat_body(model, _prompt(rng, run_id, -1, config.prompt_words), config.max_new_tokens)
        assert probe.stdin is not None
        probe_plan = {"url": url, "rate": config.probe_rate, "duration_s": config.overload_s, "body": probe_body}
        probe.stdin.write(json.dumps(probe_plan).encode() + b"\n")
        probe.stdin.flush()
        meter = CpuMeter(server)

        async def meter_window() -> None:
            await asyncio.sleep(config.skip_s)
            meter.start()
            await asyncio.sleep(config.overload_s - config.skip_s)
            meter.stop()

        metering = asyncio.create_task(meter_window())
        tasks = []
        start = time.perf_counter()
        for serial, offset in enumerate(poisson_arrivals(rate, config.overload_s, config.seed)):
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            max_tokens = rng.randint(config.min_new_tokens, config.max_new_tokens)
            body = chat_body(model, _prompt(rng, run_id, serial, config.prompt_words), max_tokens)
            is_sdk = rng.random() < config.sdk_fraction
            tasks.append(asyncio.create_task(via_sdk(body) if is_sdk else via_httpx(body)))
        logical = list(await asyncio.gather(*tasks))
        load_end = time.perf_counter() - sampler.t0
        await metering
        probe_out, _ = await asyncio.to_thread(probe.communicate)
        probes = [json.loads(line) for line in probe_out.decode().splitlines() if line.strip()]
        await asyncio.sleep(0.5)  # the server counts a request just after its last byte went out
        after = await sampler.sample_once(client)
        server_attempts = labelled(after.metrics, "http_requests_total", handler=CHAT_HANDLER) - labelled(
            before.metrics, "http_requests_total", handler=CHAT_HANDLER
        )
        # Until the level is back to 0 (or the settle time runs out), still sampling.
        deadline = time.perf_counter() + config.settle_timeout_s
        while time.perf_counter() < deadline and (not sampler.samples or sampler.samples[-1].level > 0):
            await asyncio.sleep(config.sample_interval_s)
        await asyncio.sleep(2 * config.sample_interval_s)
        await sampler.stop()
        await sdk.close()
    return OverloadRun(
        config,
        capacity,
        rate,
        logical,
        sampler.samples,
        load_start,
        load_end,
        sdk_attempts,
        sdk_retries,
        server_attempts,
        probes,
        meter.render(),
    )


# ---------------------------------------------------------------------------------- criteria


def goodput(run: OverloadRun) -> tuple[float, float, float]:
    """(tokens/s, requests/s, window s): real completions (not canned, level < 3) that ended in
    the overload window after `skip_s`."""
    config = run.config
    window_start = run.load_start_s + config.skip_s
    window_end = run.load_start_s + config.overload_s
    done = [
        item.final
        for item in run.logical
        if item.final.is_ok
        and item.final.level < 3
        and item.final.end_s is not None
        and window_start <= item.final.end_s < window_end
    ]
    span = window_end - window_start
    return sum(a.completion_tokens for a in done) / span, len(done) / span, span


def server_tokens_rate(samples: list[Sample], t_start: float, t_end: float) -> float:
    """surge_generation_tokens_total per second between the samples nearest to t_start and t_end."""
    if not samples:
        return 0.0
    first = min(samples, key=lambda s: abs(s.t_s - t_start))
    last = min(samples, key=lambda s: abs(s.t_s - t_end))
    name = "surge_generation_tokens_total"
    span = last.t_s - first.t_s
    return (last.metrics.get(name, 0.0) - first.metrics.get(name, 0.0)) / span if span > 0 else 0.0


def check_hysteresis(steps: list[tuple[float, int]], cooldown_s: float, tolerance_s: float) -> tuple[bool, str | None]:
    """Every level a step down drops took its own cooldown of calm since the previous change (up or
    down), as middleware/admission/degradation.py promises; (ok, the first violation). A drop of
    two levels at once is one the server made when nobody had asked for a level (no request, no
    scrape) for more than a window: it counts the windows that passed unobserved, and so must be
    two cooldowns after the last change. NOTE: requiring one level per observed change failed a
    run on 2 busy cores where the server's calls came just over the 1 s cooldown apart. The first
    entry is the level at the first sample, not a change: when it was set is unknown (the
    capacity phase before may have raised it), so the step after it is not timed."""
    for index, ((t_prev, level_prev), (t, level)) in enumerate(itertools.pairwise(steps)):
        dropped = level_prev - level
        if dropped > 0 and index > 0 and t - t_prev < dropped * cooldown_s - tolerance_s:
            needed = f"{dropped * cooldown_s:g} s" if dropped > 1 else "a cooldown"
            return False, (
                f"{level_prev} -> {level} at {t:.1f} s only {t - t_prev:.1f} s after the last change ({needed} needed)"
            )
    return True, None


def evaluate(run: OverloadRun) -> list[Criterion]:
    config = run.config
    overload_samples = [s for s in run.samples if run.load_start_s <= s.t_s <= run.load_end_s]
    max_waiting = max((s.waiting for s in run.samples), default=0.0)
    finals = [item.final for item in run.logical]
    # Measured by the probe process (see probe.py): the load client's own loop lags on 2 cores.
    reject_ms = [p["latency_s"] * 1000 for p in run.probes if p["status"] == 503]
    p99 = percentile(reject_ms, 99)
    rejected_httpx = [item.final for item in run.logical if item.via == "httpx" and item.final.status == 503]
    client_ms = [a.status_s * 1000 for a in rejected_httpx if a.status_s is not None]
    client_p50, client_p99 = percentile(client_ms, 50) or 0.0, percentile(client_ms, 99) or 0.0
    probe_p50 = percentile(reject_ms, 50) or 0.0
    probe_text = "no 503s" if p99 is None else f"probe: {p99:.1f} ms (p50 {probe_p50:.1f}, n={len(reject_ms)})"
    server_rate = server_tokens_rate(
        run.samples, run.load_start_s + config.skip_s, run.load_start_s + config.overload_s
    )
    unexpected = [a.error for a in finals if a.error is not None and a.error != "503"]
    tokens_s, requests_s, _ = goodput(run)
    reference = run.reference_tokens_per_s
    ratio = tokens_s / reference if reference else 0.0
    steps = level_steps(run.samples)
    peak = max((s.level for s in overload_samples), default=0.0)
    final_level = run.samples[-1].level if run.samples else -1.0
    is_hysteretic, violation = check_hysteresis(steps, config.cooldown_s, 2 * config.sample_interval_s)
    sdk_logical = sum(1 for item in run.logical if item.via == "sdk")
    num_httpx = len(run.logical) - sdk_logical
    server_sdk_attempts = run.server_attempts - num_httpx - len(run.probes)
    per_request = max(run.sdk_attempts, server_sdk_attempts) / sdk_logical if sdk_logical else 0.0
    return [
        Criterion(
            "queue within its bound",
            f"surge_requests_waiting <= {config.max_queued_requests}",
            f"max {max_waiting:.0f} over {len(run.samples)} samples",
            max_waiting <= config.max_queued_requests,
        ),
        Criterion(
            "excess refused with 503 before any stream opened",
            "some 503s; no other error, no in-stream error",
            f"{sum(a.status == 503 for a in finals)} of {len(finals)} refused; other errors: "
            f"{_counts(unexpected) or 'none'}",
            any(a.status == 503 for a in finals) and not unexpected,
        ),
        Criterion(
            "503 latency p99 (request start to response)",
            f"< {config.max_reject_p99_ms:g} ms",
            probe_text + f"; load client: p99 {client_p99:.0f} ms, p50 {client_p50:.0f} ms",
            p99 is not None and p99 < config.max_reject_p99_ms,
            is_judged=config.judges_speed,
        ),
        Criterion(
            "goodput vs capacity",
            f">= {config.min_goodput_ratio:.0%} of {reference:.0f} tok/s (the higher capacity measured)",
            f"{tokens_s:.0f} tok/s, {requests_s:.2f} req/s = {ratio:.0%} (server-side generated: "
            f"{server_rate:.0f} tok/s vs {run.capacity.server_tokens_per_s:.0f})",
            ratio >= config.min_goodput_ratio,
            is_judged=config.judges_speed,
        ),
        Criterion(
            "degradation steps up under load and back down with hysteresis",
            f"peak >= 1; each level down >= {config.cooldown_s:g} s of calm after the last change; 0 at the end",
            f"peak {peak:.0f}; {violation or 'steps ok'}; final {final_level:.0f}",
            peak >= 1 and is_hysteretic and final_level == 0,
        ),
        Criterion(
            "openai SDK retries do not snowball",
            f"attempts <= {config.max_attempts_per_request:g} x logical",
            f"{sdk_logical} logical, {run.sdk_attempts} attempts (client hook), {server_sdk_attempts:.0f} "
            f"(server counter); {run.sdk_retries} retries; {per_request:.2f} per request",
            sdk_logical > 0
            and per_request <= config.max_attempts_per_request
            and server_sdk_attempts == run.sdk_attempts,
        ),
    ]


def _counts(kinds: list[str]) -> str:
    totals: dict[str, int] = {}
    for kind in kinds:
        totals[kind] = totals.get(kind, 0) + 1
    return ", ".join(f"{kind} x{n}" for kind, n in sorted(totals.items()))


def render(run: OverloadRun, criteria: list[Criterion], command: str) -> str:
    config = run.config
    cap = run.capacity
    finals = [item.final for item in run.logical]
    ok = [a for a in finals if a.is_ok]
    by_level: dict[int, int] = {}
    for a in ok:
        by_level[a.level] = by_level.get(a.level, 0) + 1
    waiting = [s.waiting for s in run.samples if run.load_start_s <= s.t_s <= run.load_end_s]
    context = [
        f"Command: `{command}`",
        f"Machine: {machine_line()}; load average (1/5/15 min) {' -> '.join(run.load_averages)}.",
        f"Server: `surge serve --model {config.model} {' '.join(config.server_args())}`.",
        f"Load generator {'under SCHED_IDLE' if config.client_idle else 'at normal priority'} (it stands for"
        " clients on other machines; on this box it would otherwise take the server's CPU); the server and the"
        " probe at nice 0, the engine process at the server's --engine-nice.",
        f"Requests: streaming chat, {config.prompt_words}-word prompts (~32 tokens), "
        f"{config.min_new_tokens}-{config.max_new_tokens} new tokens, greedy, ignore_eos.",
        f"Capacity (closed loop, {config.capacity_users} users for {config.max_num_seqs} slots, {cap.window_s:g} s "
        f"after {config.capacity_warmup_s:g} s warm-up): {cap.requests_per_s:.2f} req/s, {cap.tokens_per_s:.0f} tok/s "
        f"({cap.num_completed} completions)"
        + (
            f"; again after the run: {run.capacity_after.requests_per_s:.2f} req/s, "
            f"{run.capacity_after.tokens_per_s:.0f} tok/s."
            if run.capacity_after is not None
            else "."
        ),
        f"Overload: Poisson {run.offered_rate:.2f} req/s ({config.factor:g}x) for {config.overload_s:g} s, "
        f"{len(finals)} requests ({sum(i.via == 'sdk' for i in run.logical)} through the openai SDK); "
        f"{len(ok)} completed (by degradation level: "
        f"{', '.join(f'{lv}: {n}' for lv, n in sorted(by_level.items())) or 'none'}); "
        f"goodput counted from {config.skip_s:g} s in.",
        f"CPU cores used (capacity window / goodput window): {cap.cpu} / {run.cpu}.",
        f"Queue depth (surge_requests_waiting) during the load: mean {sum(waiting) / max(1, len(waiting)):.1f}, "
        f"max {max(waiting, default=0):.0f}.",
        f"Degradation level over time (s since the sampler started; load {run.load_start_s:.1f}-"
        f"{run.load_end_s:.1f} s): {render_steps(level_steps(run.samples))}.",
    ]
    return render_report("Overload", context, criteria, [])


@contextlib.contextmanager
def probe_process() -> Iterator[subprocess.Popen[bytes]]:
    """scripts/reliability/probe.py, started now (so at the caller's CPU priority, not the load
    generator's); it waits for its plan on stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.reliability.probe"],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def run_overload(config: OverloadConfig, log_path: Path) -> tuple[OverloadRun, ServerProcess]:
    load_averages = [load_average()]
    with surge_server(config.model, log_path, *config.server_args()) as server, probe_process() as probe:

        async def drive() -> OverloadRun:
            model = await served_model(server.url)
            capacity = await measure_capacity(config, server, model)
            load_averages.append(load_average())
            run = await drive_overload(config, server, model, capacity, probe)
            load_averages.append(load_average())
            if config.capacity_after:
                run.capacity_after = await measure_capacity(config, server, model)
                load_averages.append(load_average())
            return run

        run = on_an_idle_thread(lambda: asyncio.run(drive()), idle=config.client_idle)
        run.load_averages = load_averages
    return run, server


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="the seconds-long version (tests)")
    parser.add_argument("--model", default="tiny", help="surge serve --model (default: tiny, the m size)")
    parser.add_argument("--overload-seconds", type=float, help="length of the overload phase")
    parser.add_argument("--factor", type=float, help="offered load / capacity (3)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `surge serve` argument (repeatable)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--log", type=Path, help="the server's log (default: a temp file)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = replace(FAST if args.fast else OverloadConfig(), model=args.model)
    if args.overload_seconds is not None:
        config = replace(config, overload_s=args.overload_seconds)
    if args.factor is not None:
        config = replace(config, factor=args.factor)
    config = replace(config, extra_server_args=tuple(args.server_arg))
    log_path = args.log or Path(tempfile.mkdtemp(prefix="surge-overload-")) / "server.log"
    run, _ = run_overload(config, log_path)
    criteria = evaluate(run)
    command = "python -m scripts.reliability.overload " + " ".join(sys.argv[1:] if argv is None else argv)
    write_report(render(run, criteria, command.strip()) + f"\nServer log: {log_path}\n", args.out)
    return 0 if all_passed(criteria) else 1


if __name__ == "__main__":
    raise SystemExit(main())
