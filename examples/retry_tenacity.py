"""Retries beyond the openai SDK's own, with tenacity, made safe by one `Idempotency-Key`.

    SURGE_BASE_URL=http://127.0.0.1:8000/v1 python examples/retry_tenacity.py

The SDK retries twice by itself. For callers that want more attempts and a deadline, this wrapper
turns the SDK's retries off and lets tenacity do them:
- it retries connection errors, timeouts, 429 (rate limited), 503 (busy, loading, shutting down)
  and 409 (the same key still running: a retry that overtook its first attempt);
- it waits what the server asks for (`retry-after-ms`, else `Retry-After`, in seconds or as an HTTP
  date) plus up to 10% jitter, and otherwise backs off exponentially with jitter;
- every attempt carries the same `Idempotency-Key`, so a retry after a timeout never runs the model
  a second time: surge answers it from its store (`Idempotent-Replayed: true`).
Environment: SURGE_BASE_URL, SURGE_API_KEY, SURGE_MODEL_NAME (see openai_sync.py).
"""

from __future__ import annotations

import email.utils
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import openai
from openai import OpenAI
from openai.types.chat import ChatCompletion
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)
from tenacity.wait import wait_base

# 409 is surge's "this Idempotency-Key is still running"; waiting for it ends in the stored result.
RETRYABLE_STATUSES = frozenset({409, 429, 503})


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError is one too
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code in RETRYABLE_STATUSES


def retry_after_seconds(exc: BaseException | None) -> float | None:
    """The wait the server asked for, in seconds, or None when it gave no hint."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    headers = exc.response.headers
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            return max(0.0, float(ms) / 1000)
        if (value := headers.get("retry-after")) is not None:
            return max(0.0, float(value))
    except ValueError:
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class wait_retry_after(wait_base):
    """The server's Retry-After plus up to 10% jitter (so clients told the same time do not come
    back together), capped at `max_wait`; `fallback` when the server gave no hint."""

    def __init__(self, fallback: wait_base, max_wait: float = 60.0) -> None:
        self.fallback = fallback
        self.max_wait = max_wait

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome is not None else None
        hint = retry_after_seconds(exc)
        if hint is None:
            return float(self.fallback(retry_state))
        return min(hint * (1 + random.uniform(0, 0.1)), self.max_wait)


@dataclass
class Reply:
    completion: ChatCompletion
    idempotency_key: str
    attempts: int
    waits: list[float] = field(default_factory=list)  # seconds slept before each retry
    is_replayed: bool = False  # surge answered from its idempotency store

    @property
    def text(self) -> str:
        return self.completion.choices[0].message.content or ""


def create_chat_completion(
    client: OpenAI,
    *,
    idempotency_key: str | None = None,
    max_attempts: int = 6,
    max_seconds: float = 120.0,
    timeout: float = 60.0,
    **params: Any,
) -> Reply:
    """`client.chat.completions.create(**params)` with retries; raises the last error when they run out."""
    key = idempotency_key or f"retry-{uuid.uuid4()}"  # made once: every attempt sends the same key
    waits: list[float] = []

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        sleep = state.next_action.sleep if state.next_action is not None else 0.0
        waits.append(sleep)
        hint = retry_after_seconds(exc)
        reason = f"HTTP {exc.status_code}" if isinstance(exc, openai.APIStatusError) else type(exc).__name__
        source = f"server asked {hint:.3f} s" if hint is not None else "backoff"
        print(
            f"attempt {state.attempt_number} failed ({reason}); retrying in {sleep:.2f} s ({source})", file=sys.stderr
        )

    retrying = Retrying(
        retry=retry_if_exception(is_retryable),
        wait=wait_retry_after(wait_random_exponential(multiplier=0.5, max=10.0)),  # full jitter
        stop=stop_after_attempt(max_attempts) | stop_after_delay(max_seconds),
        before_sleep=log_retry,
        reraise=True,  # the caller sees the SDK's own exception, not tenacity's RetryError
    )
    # max_retries=0: one layer of retries, not the SDK's inside tenacity's.
    sdk = client.with_options(max_retries=0, timeout=timeout)
    for attempt in retrying:
        with attempt:
            raw = sdk.chat.completions.with_raw_response.create(**params, extra_headers={"Idempotency-Key": key})
    return Reply(
        completion=raw.parse(),
        idempotency_key=key,
        attempts=attempt.retry_state.attempt_number,
        waits=waits,
        is_replayed=raw.headers.get("idempotent-replayed") == "true",
    )


def main() -> None:
    client = OpenAI(
        base_url=os.environ.get("SURGE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("SURGE_API_KEY", "unused"),
    )
    model = os.environ.get("SURGE_MODEL_NAME") or client.models.list().data[0].id
    params: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 16,
        "temperature": 1.0,
    }

    reply = create_chat_completion(client, **params)
    print(f"attempts={reply.attempts} waits={[round(w, 3) for w in reply.waits]} replayed={reply.is_replayed}")
    print("reply:", repr(reply.text))

    # The caller lost that reply (say its own deadline passed) and asks again with the same key:
    # surge replays the stored response instead of running the model a second time.
    again = create_chat_completion(client, idempotency_key=reply.idempotency_key, **params)
    print(f"again: attempts={again.attempts} replayed={again.is_replayed} same_text={again.text == reply.text}")


if __name__ == "__main__":
    main()
