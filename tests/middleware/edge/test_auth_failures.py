"""Failed authentications throttled per client address: the bucket, and the attack through a real server."""

from __future__ import annotations

from pathlib import Path

import httpx

from middleware.edge.auth_failures import MAX_ADDRESSES, AuthFailures
from tests.live_server import MODEL_NAME, running_server


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_address_gets_its_failures_per_minute_then_waits_for_them() -> None:
    clock = Clock()
    failures = AuthFailures(6, clock=clock)  # one attempt back every 10 s
    for _ in range(6):
        assert failures.allows_attempt("10.0.0.1")
        failures.failed("10.0.0.1")
    assert not failures.allows_attempt("10.0.0.1")
    assert failures.retry_after("10.0.0.1") == 10.0
    assert failures.allows_attempt("10.0.0.2")  # another address is not held back
    clock.now = 10.0
    assert failures.allows_attempt("10.0.0.1")
    assert (failures.num_rejected, failures.num_throttled) == (6, 1)


def test_memory_is_bounded_by_forgetting_the_oldest_addresses() -> None:
    failures = AuthFailures(1)
    for i in range(MAX_ADDRESSES + 10):
        failures.failed(f"a{i}")
    assert len(failures._buckets) == MAX_ADDRESSES
    assert failures.allows_attempt("a0")  # forgotten: a full bucket again
    assert not failures.allows_attempt(f"a{MAX_ADDRESSES + 9}")


def test_off_never_throttles() -> None:
    failures = AuthFailures(0)
    for _ in range(100):
        failures.failed("x")
    assert failures.allows_attempt("x") and failures.num_rejected == 100


def test_guessing_keys_gets_429s_while_a_valid_key_keeps_working(tiny_model_dir: Path) -> None:
    """The attack: 401s were never throttled, so an address could try keys as fast as it liked."""
    with running_server(
        tiny_model_dir,
        max_model_len=256,
        api_key=("sk-the-real-key",),
        auth_failures_per_minute=5,
        metrics_key="mk-test",  # with API keys set, /metrics needs it
    ) as live:
        url = f"{live.url}/v1/chat/completions"
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        statuses = [
            httpx.post(url, json=body, headers={"authorization": f"Bearer sk-guess-{i}"}).status_code for i in range(8)
        ]
        assert statuses == [401] * 5 + [429] * 3
        throttled = httpx.post(url, json=body)  # no key at all counts too
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
        assert throttled.json()["error"]["code"] == "rate_limit_exceeded"
        valid = httpx.post(url, json=body, headers={"authorization": "Bearer sk-the-real-key"})
        assert valid.status_code == 200
        metrics = live.scrape().text
        assert f'surge_auth_failures_total{{model="{MODEL_NAME}",outcome="rejected"}} 5.0' in metrics
        assert f'surge_auth_failures_total{{model="{MODEL_NAME}",outcome="throttled"}} 4.0' in metrics
