"""One logical request of the load: sent over httpx, streamed or not, retried with one Idempotency-Key.

Latencies are what the caller lives through: they run from the first attempt's start, so a
request that waited out a 429 shows that wait in its TTFT and end-to-end time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

# Worth another attempt (README, "Idempotency keys"): 409 is the same key still running.
RETRYABLE_STATUSES = frozenset({409, 429, 503})
# Error kinds that are not HTTP statuses; a status is its number as a string ("429").
# `stream`: an error event or a stream cut short; `invalid`: a body that is not the JSON expected.
CONNECT_ERROR, TIMEOUT, STREAM_ERROR, INVALID = "connect", "timeout", "stream", "invalid"


@dataclass
class RequestResult:
    start_s: float  # since the run started
    is_duplicate: bool = False
    error: str | None = None  # None when it succeeded, else an HTTP status ("429") or an error kind
    ttft_s: float | None = None  # to the first content token; streams only
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks of a stream
    completion_tokens: int = 0
    retried: list[str] = field(default_factory=list)  # the errors of the attempts that were retried

    @property
    def is_ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 0  # 0: one attempt, and no Idempotency-Key is sent
    base_backoff_s: float = 0.25  # exponential backoff with full jitter when the server gives no hint
    max_backoff_s: float = 10.0

    def backoff_s(self, retry_index: int, hint_s: float | None, rng: random.Random) -> float:
        if hint_s is not None:
            return min(hint_s, self.max_backoff_s)
        return rng.uniform(0, min(self.max_backoff_s, self.base_backoff_s * 2**retry_index))


class _AttemptFailed(Exception):
    def __init__(self, kind: str, retry_after_s: float | None = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.retry_after_s = retry_after_s


def retry_after_s(headers: httpx.Headers) -> float | None:
    """`retry-after-ms` (surge, OpenAI), else `Retry-After` in seconds; None when absent or a date."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                continue
    return None


async def send_request(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    policy: RetryPolicy,
    result: RequestResult,
    rng: random.Random,
) -> RequestResult:
    """Fill `result` (whose `start_s` the caller set) with the outcome of `body`, retried per `policy`."""
    if policy.max_retries:
        headers = {**headers, "Idempotency-Key": f"loadtest-{uuid.uuid4()}"}  # one key for every attempt
    start = time.perf_counter()
    for retry_index in range(policy.max_retries + 1):
        try:
            await _attempt(client, url, body, headers, start, result)
            result.error = None
            return result
        except _AttemptFailed as failure:
            result.error = failure.kind
            is_retryable = failure.kind in (CONNECT_ERROR, TIMEOUT) or (
                failure.kind.isdigit() and int(failure.kind) in RETRYABLE_STATUSES
            )
            if not is_retryable or retry_index == policy.max_retries:
                break
            result.retried.append(failure.kind)
            await asyncio.sleep(policy.backoff_s(retry_index, failure.retry_after_s, rng))
    result.e2e_s = time.perf_counter() - start
    return result


async def _attempt(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    start: float,
    result: RequestResult,
) -> None:
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                raise _AttemptFailed(str(response.status_code), retry_after_s(response.headers))
            if body.get("stream"):
                await _read_stream(response, start, result)
            else:
                usage = json.loads(await response.aread()).get("usage") or {}
                result.completion_tokens = int(usage.get("completion_tokens", 0))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise _AttemptFailed(INVALID) from exc
    except httpx.TimeoutException as exc:
        raise _AttemptFailed(TIMEOUT) from exc
    except httpx.TransportError as exc:
        raise _AttemptFailed(CONNECT_ERROR) from exc
    result.e2e_s = time.perf_counter() - start


async def _read_stream(response: httpx.Response, start: float, result: RequestResult) -> None:
    content_times: list[float] = []
    usage: dict[str, Any] | None = None
    finish_reason = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators and `:` keep-alive comments
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise _AttemptFailed(STREAM_ERROR)
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                content_times.append(time.perf_counter())
            finish_reason = choice.get("finish_reason") or finish_reason
    if finish_reason is None:
        raise _AttemptFailed(STREAM_ERROR)  # cut short: no finish_reason ever came
    if content_times:
        result.ttft_s = content_times[0] - start
        result.itl_s = [b - a for a, b in itertools.pairwise(content_times)]
    result.completion_tokens = int(usage["completion_tokens"]) if usage else len(content_times)
