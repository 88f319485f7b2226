"""The two load shapes and the live progress line.

- Open loop: requests arrive as a Poisson process at `rate` per second for `duration_s`, whether or
  not earlier ones have finished, as independent users do; a slow server grows a queue.
- Closed loop: `concurrency` users, each sending its next request when the last one ends, for
  `duration_s`; a slow server simply gets fewer requests.
Either way no request starts after `duration_s` (or past `max_requests`), and the run waits for
those in flight.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from scripts.loadtest.client import RequestResult, RetryPolicy, send_request
from scripts.loadtest.workload import Workload, WorkloadSpec, poisson_arrivals


@dataclass(frozen=True, slots=True)
class LoadConfig:
    base_url: str  # ends in /v1
    model: str
    workload: WorkloadSpec
    rate: float | None = None  # open loop at this many requests/s; None: closed loop
    concurrency: int = 8  # closed loop: users
    duration_s: float = 30.0
    max_requests: int | None = None  # stop starting requests after this many (either loop)
    is_streaming: bool = True
    temperature: float = 0.0  # 0 makes every request deterministic, which dedup requires
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_s: float = 120.0

    @property
    def mode(self) -> str:
        return (
            f"open loop, Poisson {self.rate:g} req/s"
            if self.rate is not None
            else f"closed loop, {self.concurrency} users"
        )


@dataclass
class RunResult:
    results: list[RequestResult]
    wall_s: float  # from the first request's start to the last one's end


class Progress:
    """Counts for the progress line; a sibling task prints it while the load runs."""

    def __init__(self, out: TextIO | None) -> None:
        self.out = out
        self.start = time.perf_counter()
        self.num_sent = self.num_ok = self.num_errors = self.num_tokens = 0

    def record(self, result: RequestResult) -> None:
        if result.is_ok:
            self.num_ok += 1
            self.num_tokens += result.completion_tokens
        else:
            self.num_errors += 1

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        in_flight = self.num_sent - self.num_ok - self.num_errors
        rate = self.num_tokens / elapsed if elapsed > 0 else 0.0
        return (
            f"{elapsed:6.1f}s  sent {self.num_sent}  in flight {in_flight}  ok {self.num_ok}  "
            f"errors {self.num_errors}  {rate:.0f} tok/s"
        )

    async def run(self) -> None:
        """Rewrite one line on a terminal (4 times a second); print a line a second elsewhere."""
        if self.out is None:
            return
        is_tty = self.out.isatty()
        while True:
            await asyncio.sleep(0.25 if is_tty else 1.0)
            self.out.write(f"\r{self.line()}\x1b[K" if is_tty else self.line() + "\n")
            self.out.flush()

    def finish(self) -> None:
        if self.out is not None:
            self.out.write(("\r" if self.out.isatty() else "") + self.line() + "\n")
            self.out.flush()


async def run_load(config: LoadConfig, progress_out: TextIO | None = sys.stderr) -> RunResult:
    workload = Workload(config.workload)
    url = f"{config.base_url.rstrip('/')}/chat/completions"
    base_body: dict[str, Any] = {"model": config.model, "temperature": config.temperature, **config.extra_body}
    if config.is_streaming:
        base_body |= {"stream": True, "stream_options": {"include_usage": True}}
    retry_rng = random.Random(config.workload.seed)
    progress = Progress(progress_out)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(config.timeout_s)) as client:
        start = time.perf_counter()

        async def one() -> RequestResult:
            plan = workload.next_plan()
            body = {**base_body, "max_tokens": plan.max_tokens, "messages": [{"role": "user", "content": plan.prompt}]}
            result = RequestResult(start_s=time.perf_counter() - start, is_duplicate=plan.is_duplicate)
            progress.num_sent += 1
            await send_request(client, url, body, config.headers, config.retry, result, retry_rng)
            progress.record(result)
            return result

        def may_start() -> bool:
            is_under_cap = config.max_requests is None or progress.num_sent < config.max_requests
            return is_under_cap and time.perf_counter() - start < config.duration_s

        ticker = asyncio.create_task(progress.run())
        try:
            if config.rate is None:

                async def user() -> list[RequestResult]:
                    done: list[RequestResult] = []
                    while may_start():
                        done.append(await one())
                    return done

                per_user = await asyncio.gather(*(user() for _ in range(config.concurrency)))
                results = [r for done in per_user for r in done]
            else:
                tasks = []
                for offset in poisson_arrivals(config.rate, config.duration_s, config.workload.seed):
                    await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
                    if not may_start():
                        break
                    tasks.append(asyncio.create_task(one()))
                results = list(await asyncio.gather(*tasks))
        finally:
            ticker.cancel()
        wall_s = time.perf_counter() - start
    progress.finish()
    return RunResult(sorted(results, key=lambda r: r.start_s), wall_s)
