"""Rate limits end to end: the real server on the tiny model, httpx and the openai SDK, with the
buckets in-process and on a real redis-server; Redis killed, restarted and frozen mid-test."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
import yaml
from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from middleware.keys_file import Limits
from middleware.rate_limit.asgi import RateLimitMiddleware
from middleware.rate_limit.buckets import InProcessBuckets, RedisBuckets
from middleware.rate_limit.limits import go_duration
from scripts.harness.redis_server import RedisServer
from tests.live_server import MODEL_NAME, LiveServer, running_server

USER = [{"role": "user", "content": "Tell me about the sea."}]
GLOBAL_RPM, GLOBAL_TPM = 600, 60_000
KEYS: dict[str, dict[str, int] | None] = {
    "sk-plain": None,  # the server-wide limits
    "sk-rpm3": {"rpm": 3},
    "sk-rpm60": {"rpm": 60},
    "sk-tpm300": {"tpm": 300},
    "sk-refund": {"tpm": 600},
    "sk-stream": {"tpm": 600},
    "sk-gone": {"tpm": 600},
    "sk-unlimited": {"rpm": 0, "tpm": 0, "tier": 1},
}
SERVER = {"max_model_len": 512, "max_num_seqs": 4, "max_num_batched_tokens": 128}
RESET = re.compile(r"^(0s|\d+ms|\d+(\.\d+)?s|\d+m\d+(\.\d+)?s)$")


@pytest.fixture(scope="module", params=["memory", "redis"])
def live(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveServer]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys_file.write_text(yaml.safe_dump(KEYS))
    extra: dict[str, object] = {}
    if request.param == "redis":
        redis.Redis.from_url(redis_server.url).flushall()
        extra["redis_url"] = redis_server.url
    with running_server(
        tiny_model_dir,
        keys_file=str(keys_file),
        api_key=("sk-flag",),
        rate_limit_rpm=GLOBAL_RPM,
        rate_limit_tpm=GLOBAL_TPM,
        **SERVER,
        **extra,
    ) as server:
        yield server


def post(url: str, key: str | None = None, path: str = "/v1/chat/completions", **body: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    payload = {"model": MODEL_NAME, "messages": USER, "max_tokens": 1, **body} if body != {"raw": True} else {}
    return httpx.post(url + path, json=payload, headers=headers, timeout=10)


def bucket_state(url: str, key: str | None = None) -> httpx.Response:
    """A request that fails validation (400) before any reservation: its headers read the buckets."""
    return post(url, key, raw=True)


def remaining_tokens(response: httpx.Response) -> int:
    return int(response.headers["x-ratelimit-remaining-tokens"])


# --- header format ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0001, "1ms"),
        (0.12, "120ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (8.64, "8.64s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (89.088, "1m29.088s"),
        (3723.5, "1h2m3.5s"),
    ],
)
def test_resets_are_written_as_go_durations_like_openai(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


# --- both modes -----------------------------------------------------------------------------------


def test_every_response_on_the_generation_endpoints_carries_the_headers(live: LiveServer) -> None:
    begin = time.monotonic()
    first = post(live.url, "sk-plain")
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == str(GLOBAL_RPM)
    assert first.headers["x-ratelimit-remaining-requests"] == str(GLOBAL_RPM - 1)
    assert first.headers["x-ratelimit-reset-requests"] == "100ms"  # one request at 10 per second
    assert first.headers["x-ratelimit-limit-tokens"] == str(GLOBAL_TPM)
    usage = first.json()["usage"]
    # Settled before the headers went out: only the tokens used are gone (plus a little refill).
    assert GLOBAL_TPM - usage["total_tokens"] <= remaining_tokens(first) <= GLOBAL_TPM
    with httpx.stream(
        "POST",
        f"{live.url}/v1/chat/completions",
        json={"model": MODEL_NAME, "messages": USER, "max_tokens": 3, "stream": True},
        headers={"Authorization": "Bearer sk-plain"},
    ) as streamed:
        assert streamed.status_code == 200
        # Two taken; the bucket refills one request every 100 ms, so on a slow machine (a loaded
        # CI box) what refilled since the first reservation may be back.
        refilled = int((time.monotonic() - begin) * GLOBAL_RPM / 60)
        remaining = int(streamed.headers["x-ratelimit-remaining-requests"])
        assert GLOBAL_RPM - 2 <= remaining <= min(GLOBAL_RPM - 1, GLOBAL_RPM - 2 + refilled)
        assert streamed.read().endswith(b"data: [DONE]\n\n")
    completion = post(live.url, "sk-plain", path="/v1/completions", prompt="Once upon a time")
    failed = bucket_state(live.url, "sk-plain")
    for response in (streamed, completion, failed):
        for kind in ("requests", "tokens"):
            assert int(response.headers[f"x-ratelimit-limit-{kind}"]) > 0
            assert int(response.headers[f"x-ratelimit-remaining-{kind}"]) > 0
            assert RESET.match(response.headers[f"x-ratelimit-reset-{kind}"])
    assert failed.status_code == 400
    models = httpx.get(f"{live.url}/v1/models", headers={"Authorization": "Bearer sk-plain"})
    assert not any(name.startswith("x-ratelimit") for name in models.headers)


def test_over_the_requests_limit_is_openais_429(live: LiveServer) -> None:
    assert [post(live.url, "sk-rpm3").status_code for _ in range(3)] == [200] * 3
    refused = post(live.url, "sk-rpm3")
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded" and error["param"] is None
    assert error["message"].startswith(
        "Rate limit reached for requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 19."
    )
    assert refused.headers["retry-after"] == "20"  # 3 per minute: one every 20 s
    assert 19_000 < int(refused.headers["retry-after-ms"]) <= 20_000
    assert refused.headers["x-ratelimit-limit-requests"] == "3"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-limit-tokens"] == str(GLOBAL_TPM)


def test_over_the_tokens_limit_is_a_429_of_type_tokens(live: LiveServer) -> None:
    first = post(live.url, "sk-tpm300", max_tokens=5)
    assert first.status_code == 200
    num_prompt = first.json()["usage"]["prompt_tokens"]
    refused = post(live.url, "sk-tpm300", max_tokens=300 - num_prompt - 1)  # costs 299 of what is left
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "tokens" and error["code"] == "rate_limit_exceeded"
    assert error["message"].startswith("Rate limit reached for tokens per min (TPM): Limit 300, Used ")
    assert ", Requested 299. Please try again in " in error["message"]
    assert 0 < int(refused.headers["retry-after-ms"]) <= 60_000
    assert refused.headers["x-ratelimit-limit-tokens"] == "300"
    assert remaining_tokens(refused) < 299
    # More than a whole minute's worth never fits: no retry can help, so no Retry-After.
    too_large = post(live.url, "sk-tpm300", max_tokens=400)
    assert too_large.status_code == 429
    assert too_large.json()["error"]["message"].startswith(
        f"Request too large for tokens per min (TPM): Limit 300, Requested {num_prompt + 400}."
    )
    assert "retry-after" not in too_large.headers


def test_the_sdk_raises_rate_limit_error_and_its_retries_succeed_once_tokens_refill(live: LiveServer) -> None:
    no_retries = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-rpm60", max_retries=0, timeout=10)
    for _ in range(100):  # empty the 60-per-minute bucket
        if bucket_state(live.url, "sk-rpm60").status_code == 429:
            break
    else:
        pytest.fail("the requests bucket never emptied")
    caught: openai.RateLimitError | None = None
    for _ in range(3):  # it refills one request per second, so one may slip in meanwhile
        try:
            no_retries.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=1)  # type: ignore[arg-type]
        except openai.RateLimitError as exc:
            caught = exc
            break
    assert caught is not None, "the SDK never saw a 429"
    assert caught.status_code == 429 and caught.code == "rate_limit_exceeded" and caught.type == "requests"
    retrying = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-rpm60", max_retries=2, timeout=10)
    for _ in range(3):  # on a busy machine a token may refill before the call: empty it again
        while bucket_state(live.url, "sk-rpm60").status_code != 429:
            pass
        reply = retrying.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=USER, max_tokens=1)  # type: ignore[arg-type]
        assert reply.parse().choices
        if reply.retries_taken >= 1:  # it waited retry-after-ms (under a second at 1 per second)
            break
    else:
        pytest.fail("the SDK never had to retry")


def test_unused_tokens_are_refunded_when_a_request_finishes_early(live: LiveServer) -> None:
    # Find a stop string that ends a greedy 100-token reply after a few tokens (unlimited key).
    full = post(live.url, "sk-unlimited", max_tokens=100, temperature=0).json()
    short = post(live.url, "sk-unlimited", max_tokens=4, temperature=0).json()
    text, prefix = full["choices"][0]["message"]["content"], short["choices"][0]["message"]["content"]
    stop = text[len(prefix) : len(prefix) + 4] if full["usage"]["completion_tokens"] == 100 else None
    assert stop is None or len(stop) == 4

    first = post(live.url, "sk-refund", max_tokens=100, temperature=0, stop=stop)
    usage = first.json()["usage"]
    assert usage["completion_tokens"] < 20
    used = usage["prompt_tokens"] + usage["completion_tokens"]
    # 600 per minute refills 10 per second; the request took well under a second.
    assert 600 - used <= remaining_tokens(first) <= 600 - used + 10
    after = post(live.url, "sk-refund", max_tokens=1)
    reserved_next = usage["prompt_tokens"] + 1
    assert 600 - used - reserved_next <= remaining_tokens(after) <= 600 - used - reserved_next + 10 + 1


def test_a_stream_cut_by_the_client_refunds_what_it_did_not_use(live: LiveServer) -> None:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", f"{live.url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-stream"}
    ) as response:
        at_start = remaining_tokens(response)  # 600 - prompt - 300 reserved
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
    deadline = time.monotonic() + 3
    while remaining_tokens(bucket_state(live.url, "sk-stream")) < at_start + 250:
        assert time.monotonic() < deadline, "the unused reservation never came back"
        time.sleep(0.02)
    live.wait_idle()


def test_a_json_request_whose_client_left_refunds_what_it_did_not_use(live: LiveServer) -> None:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 450, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):  # gone after 0.15 s, long before 450 tokens
        httpx.post(
            f"{live.url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-gone"}, timeout=0.15
        )
    # Reserved: prompt + 450 of 600, leaving under 150; generated before the abort: far fewer than 450.
    deadline = time.monotonic() + 3
    while remaining_tokens(bucket_state(live.url, "sk-gone")) < 350:
        assert time.monotonic() < deadline, "the unused reservation never came back"
        time.sleep(0.02)
    live.wait_idle()


def test_keys_from_the_file_and_the_flag_are_accepted_and_others_rejected(live: LiveServer) -> None:
    unknown = post(live.url, "sk-nope")
    assert unknown.status_code == 401
    assert unknown.json()["error"]["code"] == "invalid_api_key"
    assert post(live.url, None).status_code == 401
    flagged = post(live.url, "sk-flag")
    assert flagged.status_code == 200 and flagged.headers["x-ratelimit-limit-requests"] == str(GLOBAL_RPM)
    unlimited = post(live.url, "sk-unlimited")  # rpm 0 and tpm 0 in the file: no limits, no headers
    assert unlimited.status_code == 200
    assert not any(name.startswith("x-ratelimit") for name in unlimited.headers)


# --- Redis failures and replicas -------------------------------------------------------------------


def test_redis_killed_fails_open_to_this_replicas_share_and_recovers(tiny_model_dir: Path) -> None:
    with (
        RedisServer() as own_redis,
        running_server(
            tiny_model_dir,
            redis_url=own_redis.url,
            redis_timeout_ms=50,
            rate_limit_rpm=10,
            rate_limit_replicas=2,
            **SERVER,
        ) as live,
    ):
        store = redis.Redis.from_url(own_redis.url)
        assert post(live.url).headers["x-ratelimit-remaining-requests"] == "9"
        assert store.keys("surge:ratelimit:requests:*")  # no keys configured: one bucket per client address

        own_redis.kill()
        answered = [post(live.url) for _ in range(6)]
        # Fail open to an in-process bucket holding this replica's share: 10 / 2 replicas.
        assert [r.status_code for r in answered] == [200] * 5 + [429]
        assert {r.headers["x-ratelimit-limit-requests"] for r in answered} == {"5"}
        assert live.state.redis is not None and not live.state.redis.is_up
        assert live.state.redis.num_fallbacks == 1
        assert isinstance(live.state.rate_limits, RedisBuckets) and live.state.rate_limits.num_fallback_decisions >= 6

        own_redis.start()  # same port, empty
        deadline = time.monotonic() + 10  # the probe finds it within a probe interval (0.5 s)
        while (back := post(live.url)).headers["x-ratelimit-limit-requests"] != "10":
            assert time.monotonic() < deadline, "decisions never went back to Redis"
            time.sleep(0.05)
        assert back.status_code == 200
        assert live.state.redis.is_up
        assert store.keys("surge:ratelimit:requests:*")  # decisions are on Redis again


def timed_post(url: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = post(url)
    return response, time.monotonic() - started


@pytest.mark.parametrize(
    "speed", [pytest.param(False, id="answers"), pytest.param(True, id="speed", marks=pytest.mark.reliability)]
)
def test_frozen_redis_fails_open_and_costs_a_request_at_most_the_timeout(tiny_model_dir: Path, speed: bool) -> None:
    """A frozen Redis: every request still answered, on one fallback. How long they wait (at most
    about the timeout) is the reliability run's to check (`pytest -m reliability`)."""
    with (
        RedisServer() as own_redis,
        running_server(
            tiny_model_dir,
            redis_url=own_redis.url,
            redis_timeout_ms=50,
            rate_limit_rpm=600,
            rate_limit_tpm=60_000,
            **SERVER,
        ) as live,
    ):
        assert post(live.url).status_code == 200
        baseline = min(timed_post(live.url)[1] for _ in range(3))
        own_redis.freeze()
        try:
            answered = [timed_post(live.url) for _ in range(8)]
        finally:
            own_redis.thaw()
        assert all(r.status_code == 200 for r, _ in answered)
        assert live.state.redis is not None and live.state.redis.num_fallbacks == 1
        if speed:
            # The first call waits out the 50 ms timeout; after that at most one probe per half
            # second waits, so no request waits much longer than the timeout.
            slowest = max(elapsed for _, elapsed in answered)
            assert 0.045 <= slowest < baseline + 0.5


def test_two_replicas_sharing_redis_enforce_one_limit(tiny_model_dir: Path, redis_url: str) -> None:
    settings = {"redis_url": redis_url, "rate_limit_rpm": 10, **SERVER}
    with running_server(tiny_model_dir, **settings) as first, running_server(tiny_model_dir, **settings) as second:
        statuses = [post(live.url).status_code for _ in range(7) for live in (first, second)]
    assert statuses.count(200) == 10 and statuses.count(429) == 4


def test_a_keys_file_with_limits_turns_rate_limits_on(tiny_model_dir: Path, tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"sk-limited": {"rpm": 1}, "sk-free": None}))
    with running_server(tiny_model_dir, keys_file=str(keys_file), **SERVER) as live:
        assert [post(live.url, "sk-limited").status_code for _ in range(2)] == [200, 429]
        free = post(live.url, "sk-free")
        assert free.status_code == 200 and "x-ratelimit-limit-requests" not in free.headers


# --- the middleware on its own -----------------------------------------------------------------------


async def test_non_http_scopes_and_other_paths_pass_through_untouched() -> None:
    seen: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"] + " " + scope.get("path", ""))

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        raise AssertionError("the middleware must not answer these")

    buckets = InProcessBuckets()
    middleware = RateLimitMiddleware(inner, buckets=buckets, limits=Limits(rpm=1))
    await middleware({"type": "lifespan"}, receive, send)
    for _ in range(3):  # never counted, however many
        await middleware({"type": "http", "method": "GET", "path": "/v1/models", "headers": []}, receive, send)
    await middleware({"type": "http", "method": "POST", "path": "/tokenize", "headers": []}, receive, send)
    assert seen == ["lifespan ", *["http /v1/models"] * 3, "http /tokenize"]
    assert len(buckets) == 0


def test_limits_are_checked_at_startup() -> None:
    with pytest.raises(ValueError):
        Limits(rpm=-1)
    with pytest.raises(TypeError):
        RateLimitMiddleware(FastAPI(), buckets=InProcessBuckets(), limits={"rpm": 1})  # type: ignore[arg-type]
