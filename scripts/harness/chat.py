"""One HTTP attempt at POST /v1/chat/completions over httpx, as a client sees it: the status and
headers, the stream read to its end (or deliberately left after a few chunks), the timings, usage.

The load tester retries around it (scripts/loadtest/client.py); the reliability drivers and the
fault tests read single attempts. Latencies are from the attempt's start; `start_s` and `end_s` are
from `t0`, the caller's run start, so attempts line up on one timeline.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

# Error kinds that are not HTTP statuses; a status is its number as a string ("429").
CONNECT = "connect"  # no response: refused, reset, closed
TIMEOUT = "timeout"
INVALID = "invalid"  # a body that is not the JSON expected
STREAM_ERROR = "stream-error"  # an error event after the stream opened
STREAM_CUT = "stream-cut"  # the stream ended without a finish_reason
DISCONNECTED = "disconnected"  # the caller left after `max_chunks`, on purpose


@dataclass
class ChatAttempt:
    start_s: float  # since t0
    status: int | None = None  # None: no response (connection error, timeout)
    error: str | None = None  # None when it succeeded; else the status ("503") or a kind above
    status_s: float | None = None  # to the status line and headers
    ttft_s: float | None = None  # to the first chunk with content (streams)
    end_s: float | None = None  # since t0
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks (streams)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None
    is_done: bool = False  # a stream ended with `data: [DONE]`
    level: int = 0  # x-surge-degraded
    is_replayed: bool = False  # Idempotent-Replayed: true
    retry_after_s: float | None = None  # the server's hint on a refusal
    headers: dict[str, str] = field(default_factory=dict)
    detail: str = ""  # the body of a refusal (its first 500 characters), or the transport error

    @property
    def is_ok(self) -> bool:
        return self.error is None

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s


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


async def send_chat(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    t0: float | None = None,
    headers: dict[str, str] | None = None,
    max_chunks: int | None = None,
) -> ChatAttempt:
    """Send `body` once and read the SSE stream (or JSON) to the end, or stop after `max_chunks`
    content chunks and close the connection (error `disconnected`)."""
    start = time.perf_counter()
    attempt = ChatAttempt(start_s=start - (start if t0 is None else t0))
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
                attempt.retry_after_s = retry_after_s(response.headers)
            elif body.get("stream"):
                await _read_stream(response, attempt, start, max_chunks)
            else:
                reply = json.loads(await response.aread())
                usage = reply.get("usage") or {}
                attempt.completion_tokens = int(usage.get("completion_tokens", 0))
                attempt.prompt_tokens = int(usage.get("prompt_tokens", 0))
                attempt.finish_reason = (reply.get("choices") or [{}])[0].get("finish_reason")
    except httpx.TimeoutException:
        attempt.error = TIMEOUT
    except httpx.TransportError as exc:
        attempt.error, attempt.detail = CONNECT, f"{type(exc).__name__}: {exc}"
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        attempt.error = INVALID
    attempt.end_s = attempt.start_s + (time.perf_counter() - start)
    return attempt


async def _read_stream(response: httpx.Response, attempt: ChatAttempt, start: float, max_chunks: int | None) -> None:
    content_times: list[float] = []
    usage: dict[str, Any] | None = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators and `:` keep-alive comments
        data = line[5:].strip()
        if data == "[DONE]":
            attempt.is_done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:
            attempt.error = STREAM_ERROR
            return
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                content_times.append(time.perf_counter())
            attempt.finish_reason = choice.get("finish_reason") or attempt.finish_reason
        if max_chunks is not None and len(content_times) >= max_chunks:
            attempt.error = DISCONNECTED  # leaving the `async with` closes the connection
            return
    if content_times:
        attempt.ttft_s = content_times[0] - start
        attempt.itl_s = [b - a for a, b in itertools.pairwise(content_times)]
    attempt.completion_tokens = int(usage["completion_tokens"]) if usage else len(content_times)
    attempt.prompt_tokens = int(usage.get("prompt_tokens", 0)) if usage else 0
    if attempt.finish_reason is None:
        attempt.error = STREAM_CUT
