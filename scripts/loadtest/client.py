"""One logical request of the load: attempts sent with the harness's chat client, retried with one
Idempotency-Key.

Latencies are what the caller lives through: they run from the first attempt's start, so a
request that waited out a 429 shows that wait in its TTFT and end-to-end time.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from scripts.harness.chat import CONNECT, TIMEOUT, send_chat

# Worth another attempt (docs/api.md, "Idempotency keys"): 409 is the same key still running.
RETRYABLE_STATUSES = frozenset({409, 429, 503})


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


def is_retryable(error: str) -> bool:
    return error in (CONNECT, TIMEOUT) or (error.isdigit() and int(error) in RETRYABLE_STATUSES)


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
    first_start = time.perf_counter()
    for retry_index in range(policy.max_retries + 1):
        attempt = await send_chat(client, url, body, t0=first_start, headers=headers)
        result.error = attempt.error
        result.e2e_s = attempt.end_s  # from the first attempt's start
        if attempt.is_ok:
            if attempt.ttft_s is not None:
                result.ttft_s = attempt.start_s + attempt.ttft_s
            result.itl_s = attempt.itl_s
            result.completion_tokens = attempt.completion_tokens
            return result
        assert attempt.error is not None
        if not is_retryable(attempt.error) or retry_index == policy.max_retries:
            break
        result.retried.append(attempt.error)
        await asyncio.sleep(policy.backoff_s(retry_index, attempt.retry_after_s, rng))
    result.e2e_s = time.perf_counter() - first_start
    return result
