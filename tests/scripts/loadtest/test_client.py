"""One load-test request against a scripted transport: retries, one Idempotency-Key, Retry-After."""

from __future__ import annotations

import asyncio
import json
import random

import httpx

from scripts.harness.chat import retry_after_s
from scripts.loadtest.client import RequestResult, RetryPolicy, send_request

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
OK = {"choices": [{"message": {"content": "a b c"}, "finish_reason": "length"}], "usage": {"completion_tokens": 3}}


def run(
    statuses: list[int], policy: RetryPolicy, body: dict[str, object] = BODY
) -> tuple[RequestResult, list[httpx.Request]]:
    """Answer attempts with `statuses` in turn (200 is a JSON or SSE success)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = statuses[len(seen) - 1]
        if status != 200:
            return httpx.Response(status, headers={"retry-after-ms": "30", "retry-after": "1"}, json={"error": {}})
        if body.get("stream"):
            events = [
                {"choices": [{"delta": {"content": "a"}, "finish_reason": None}]},
                {"choices": [{"delta": {"content": " b"}, "finish_reason": "length"}]},
                {"choices": [], "usage": {"completion_tokens": 2}},
            ]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + ": keep-alive\n\ndata: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=OK)

    async def go() -> RequestResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            result = RequestResult(start_s=0.0)
            return await send_request(
                client, "http://x/v1/chat/completions", body, {}, policy, result, random.Random(0)
            )

    return asyncio.run(go()), seen


def test_retries_with_one_idempotency_key_and_waits_the_servers_hint() -> None:
    result, seen = run([429, 503, 200], RetryPolicy(max_retries=3))
    assert result.is_ok and result.retried == ["429", "503"] and result.completion_tokens == 3
    keys = {request.headers["idempotency-key"] for request in seen}
    assert len(seen) == 3 and len(keys) == 1
    assert result.e2e_s is not None and result.e2e_s >= 0.06  # two waits of retry-after-ms 30


def test_no_retries_means_no_key_and_the_status_is_the_error() -> None:
    result, seen = run([429], RetryPolicy())
    assert result.error == "429" and result.retried == []
    assert "idempotency-key" not in seen[0].headers


def test_a_400_is_not_retried_and_retries_run_out() -> None:
    assert run([400, 200], RetryPolicy(max_retries=3))[0].error == "400"
    result, seen = run([503, 503, 503], RetryPolicy(max_retries=2))
    assert result.error == "503" and len(seen) == 3 and result.retried == ["503", "503"]


def test_stream_timings_and_usage() -> None:
    result, _ = run([200], RetryPolicy(), {**BODY, "stream": True})
    assert result.is_ok and result.completion_tokens == 2 and len(result.itl_s) == 1
    assert result.ttft_s is not None and result.e2e_s is not None and result.ttft_s <= result.e2e_s


def test_retry_after_prefers_milliseconds() -> None:
    assert retry_after_s(httpx.Headers({"retry-after-ms": "250", "retry-after": "1"})) == 0.25
    assert retry_after_s(httpx.Headers({"retry-after": "2"})) == 2.0
    assert retry_after_s(httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) is None
