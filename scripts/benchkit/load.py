"""The load runner: streaming chat requests against a system under test, and their summary.

Closed loop (`concurrency` workers, each sending `requests_per_client` requests back to back) or
open loop (Poisson arrivals at `rate` requests/s for `duration_s` seconds, however many are in flight).
Knows nothing about how a system is started: only its `base_url`, `model_name`, `request_extras`
and `request_headers()`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from scripts.benchkit.rawhttp import RawHttpClient, RawHttpError
from scripts.harness.stats import percentile

REQUEST_TIMEOUT_S = 600.0  # one request, first byte to last
# 8 words come to 27-38 (mean 32) prompt tokens with the tiny model's tokenizer and ChatML template.
DEFAULT_PROMPT_WORDS = 8
WORD_POOL = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line"
)


class SystemUnderTest(Protocol):
    name: str
    model_name: str  # the `model` field requests must carry
    request_extras: dict[str, Any]  # extra request-body fields it accepts (e.g. ignore_eos)

    @property
    def base_url(self) -> str: ...  # valid once start() has returned

    def request_headers(self) -> dict[str, str]: ...  # once per request (e.g. a fresh Idempotency-Key)
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def peak_rss_mib(self) -> float | None: ...
    def stats(self) -> dict[str, Any]: ...  # extra numbers for the JSON row, read after the load


@dataclass
class RunningServer:
    """A server that something else starts and stops (a router in front of replicas, a test's fake),
    as a SystemUnderTest: requests carry `model_name` and `request_extras`, nothing more."""

    name: str
    base_url: str
    model_name: str = "m"
    request_extras: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})

    def request_headers(self) -> dict[str, str]:
        return {}

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def peak_rss_mib(self) -> float | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {}


@dataclass
class RequestResult:
    error: str | None = None
    ttft_s: float | None = None  # until the first chunk with non-empty content
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    cached_tokens: int | None = None  # None: the server did not report prompt_tokens_details
    # The reply, for callers that send it back (a conversation's next turn); not in the JSON report.
    text: str = field(default="", repr=False, metadata={"report": False})


def cached_tokens(usage: dict[str, Any] | None) -> int | None:
    """usage.prompt_tokens_details.cached_tokens, or None when the server does not report it."""
    details = (usage or {}).get("prompt_tokens_details")
    if not isinstance(details, dict) or details.get("cached_tokens") is None:
        return None
    return int(details["cached_tokens"])


@dataclass(frozen=True)
class LoadSpec:
    concurrency: int
    requests_per_client: int
    max_tokens: int
    prompt_words: int
    seed: int = 0
    rate: float | None = None  # open loop: Poisson arrivals at this many requests/s (concurrency unused)
    duration_s: float = 10.0  # open loop: arrivals stop after this long; the run waits for the last one


class StatusError(Exception):
    """The server answered a stream with a status other than 200; the message holds its body's start."""


async def sse_events(
    client: RawHttpClient, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of one streamed POST, as they arrive (keep-alives and `[DONE]` skipped)."""
    request_headers = {"content-type": "application/json", "accept": "text/event-stream", **(headers or {})}
    async with client.stream("POST", path, json.dumps(body).encode(), request_headers) as (response, chunks):
        if response.status != 200:
            text = b"".join([chunk async for chunk in chunks]).decode(errors="replace")[:200]
            raise StatusError(f"HTTP {response.status}: {text}")
        if response.headers.get("x-surge-degraded") in ("3", "4"):
            # surge's canned reply (or a replay) at degradation level 3: a 200 the model never
            # computed, so an error here, not tokens (docs/traffic.md, tiered degradation).
            raise StatusError(f"degraded reply (x-surge-degraded: {response.headers['x-surge-degraded']})")
        pending = b""
        async for chunk in chunks:
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()  # an incomplete last line waits for the next chunk
            for line in lines:
                if not line.startswith(b"data:"):
                    continue  # blank separators and `:` keep-alive comments
                data = line[5:].strip()
                if data == b"[DONE]":  # NOTE: not required; some servers end without it
                    continue
                yield json.loads(data)


async def stream_chat(
    client: RawHttpClient, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> RequestResult:
    result = RequestResult()
    content_times: list[float] = []
    parts: list[str] = []
    finish_reason, usage = None, None
    start = time.perf_counter()
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            async for event in sse_events(client, path, body, headers):
                if "error" in event:
                    return RequestResult(error=f"stream error: {event['error']}")
                usage = event.get("usage") or usage
                for choice in event.get("choices") or ():
                    if content := (choice.get("delta") or {}).get("content"):
                        content_times.append(time.perf_counter())
                        parts.append(content)
                    finish_reason = choice.get("finish_reason") or finish_reason
    except StatusError as exc:
        return RequestResult(error=str(exc))
    except (RawHttpError, json.JSONDecodeError, TimeoutError) as exc:
        return RequestResult(error=f"{type(exc).__name__}: {exc}")
    result.e2e_s, result.text = time.perf_counter() - start, "".join(parts)
    if not content_times or finish_reason is None:
        result.error = f"incomplete stream: {len(content_times)} content chunks, finish_reason={finish_reason}"
        return result
    result.ttft_s = content_times[0] - start
    result.itl_s = [b - a for a, b in itertools.pairwise(content_times)]
    result.prompt_tokens = usage.get("prompt_tokens") if usage else None
    result.cached_tokens = cached_tokens(usage)
    result.completion_tokens = int(usage["completion_tokens"]) if usage else len(content_times)
    return result


def make_prompts(spec: LoadSpec, count: int) -> list[str]:
    """Every request gets its own prompt, so no server can answer one from a prefix cache."""
    rng, words = random.Random(spec.seed), WORD_POOL.split()
    return [" ".join(rng.choices(words, k=spec.prompt_words)) for _ in range(count)]


def arrival_times(rate: float, duration_s: float, seed: int) -> list[float]:
    """Poisson arrivals: exponential gaps with mean 1/rate, offsets in [0, duration_s)."""
    rng, times, t = random.Random(seed), list[float](), 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return times
        times.append(t)


async def run_load(
    sut: SystemUnderTest, spec: LoadSpec, on_done: Callable[[], None] | None = None
) -> tuple[list[RequestResult], float, float]:
    """Closed loop (`concurrency` workers, `requests_per_client` each) or, with `spec.rate`, open loop.

    `on_done` is called after every request (a progress bar). Returns (results, wall seconds of the
    whole load, CPU seconds this client process used).
    """
    path = "/v1/chat/completions"
    body = {"model": sut.model_name, "max_tokens": spec.max_tokens, "temperature": 0, "stream": True}
    body |= {"stream_options": {"include_usage": True}, **sut.request_extras}
    client = RawHttpClient(sut.base_url)
    try:

        async def one(prompt: str) -> RequestResult:
            body_i = {**body, "messages": [{"role": "user", "content": prompt}]}
            result = await stream_chat(client, path, body_i, sut.request_headers())
            if on_done is not None:
                on_done()
            return result

        # Open the connections before the clock runs: a closed loop's first burst then measures
        # the server, not TCP handshakes.
        await client.open_connections(spec.concurrency if spec.rate is None else 64)
        cpu_start, start = time.process_time(), time.perf_counter()
        if spec.rate is None:
            per_client = spec.requests_per_client
            prompts = make_prompts(spec, spec.concurrency * per_client)

            async def worker(index: int) -> list[RequestResult]:
                return [await one(p) for p in prompts[index * per_client : (index + 1) * per_client]]

            per_worker = await asyncio.gather(*(worker(i) for i in range(spec.concurrency)))
            results = [r for worker_results in per_worker for r in worker_results]
        else:
            offsets = arrival_times(spec.rate, spec.duration_s, spec.seed)
            tasks = []
            for offset, prompt in zip(offsets, make_prompts(spec, len(offsets)), strict=True):
                await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
                tasks.append(asyncio.create_task(one(prompt)))
            results = list(await asyncio.gather(*tasks))
        wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        await client.aclose()
    return results, wall_s, cpu_s


class Counted(Protocol):
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int


def count(results: Sequence[Counted], wall_s: float) -> dict[str, Any]:
    """The counts every summary starts from: requests, errors, tokens, tokens/s."""
    ok = [r for r in results if r.error is None]
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    num_tokens = sum(r.completion_tokens for r in ok)
    return {
        "num_requests": len(results),
        "num_errors": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "completion_tokens": num_tokens,
        "mean_prompt_tokens": sum(prompt) / len(prompt) if prompt else None,
        "wall_s": wall_s,
        "tokens_per_s": num_tokens / wall_s if wall_s > 0 else 0.0,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
    }


def summarize(results: list[RequestResult], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    summary = count(results, wall_s)
    samples: dict[str, list[float | None]] = {"ttft": [r.ttft_s for r in ok], "e2e": [r.e2e_s for r in ok]}
    samples["itl"] = [gap for r in ok for gap in r.itl_s]
    for name, values in samples.items():
        for q in (50, 99):
            summary[f"{name}_p{q}_s"] = percentile([v for v in values if v is not None], q)
    return summary
