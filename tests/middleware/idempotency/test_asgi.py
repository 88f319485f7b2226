"""Idempotency keys end to end: the real server and tiny model, httpx, the openai SDK, real Redis.

Every behaviour runs against a server with the in-process store and one with the Redis store;
the cross-replica claim and the Redis outage use servers and a redis-server of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from scripts.harness.redis_server import RedisServer
from tests.live_server import MODEL_NAME, LiveServer, running_server

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Tell me about the sea."}]
LONG = 900  # tokens: a stream that runs for a good while (about 1 ms per token here)
# Generous: these tests are about claims, not about timeouts, and the suite loads the machine.
REDIS_TIMEOUT_MS = 2000


@pytest.fixture(scope="module", params=["memory", "redis"])
def live(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[LiveServer]:
    settings: dict[str, Any] = {"max_model_len": 1024, "max_num_seqs": 8, "max_num_batched_tokens": 128}
    if request.param == "redis":
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        settings.update(redis_url=redis_server.url, redis_timeout_ms=REDIS_TIMEOUT_MS)
    with running_server(tiny_model_dir, **settings) as server:
        yield server


def chat(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": USER, "max_tokens": max_tokens, "temperature": 1.0, **extra}


def post(url: str, body: dict[str, Any], key: str | None, path: str = CHAT, timeout: float = 30) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return httpx.post(url + path, json=body, headers=headers, timeout=timeout)


def sdk(live: LiveServer, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", **{"max_retries": 0, **kwargs})


def sdk_args(body: dict[str, Any], key: str) -> dict[str, Any]:
    """The SDK's arguments for `body` under `key` (vLLM's `ignore_eos` goes in `extra_body`)."""
    args = {name: value for name, value in body.items() if name != "ignore_eos"}
    extra = {"ignore_eos": body["ignore_eos"]} if "ignore_eos" in body else None
    return {**args, "extra_body": extra, "extra_headers": {"Idempotency-Key": key}}


def new_key() -> str:
    return str(uuid.uuid4())


def data_lines(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().split("\n") if line.startswith("data: ")]


@contextlib.contextmanager
def running_stream(live: LiveServer, body: dict[str, Any], key: str) -> Iterator[Iterator[str]]:
    """A stream under `key` that has started (first event read); leaving the block disconnects."""
    with httpx.stream("POST", live.url + CHAT, json=body, headers={"Idempotency-Key": key}, timeout=30) as response:
        assert response.status_code == 200
        # NOTE: keep the iterator: a dropped one is closed, and closes the response with it.
        lines = response.iter_lines()
        next(lines)
        yield lines


def assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] is None and error["message"]


def test_json_replay_is_byte_for_byte(live: LiveServer) -> None:
    key = new_key()
    first = post(live.url, chat(), key)
    assert first.status_code == 200
    assert "idempotent-replayed" not in first.headers
    replay = post(live.url, chat(), key)
    assert replay.status_code == 200
    assert replay.content == first.content  # same id, same sampled text: the model did not run again
    for name in ("content-type", "content-length"):
        assert replay.headers[name] == first.headers[name]
    assert replay.headers["idempotent-replayed"] == "true"
    # The SDK sends the same JSON (other bytes, same canonical form): also a replay.
    raw = sdk(live).chat.completions.with_raw_response.create(**sdk_args(chat(), key))
    assert raw.headers["idempotent-replayed"] == "true"
    assert raw.parse().id == first.json()["id"]


def test_completions_endpoint_replays_too(live: LiveServer) -> None:
    key = new_key()
    body = {"model": MODEL_NAME, "prompt": "Once upon", "max_tokens": 6, "temperature": 1.0}
    first = post(live.url, body, key, path="/v1/completions")
    replay = post(live.url, body, key, path="/v1/completions")
    assert first.status_code == 200 and replay.content == first.content
    assert replay.headers["idempotent-replayed"] == "true"
    # The same key on the other endpoint is another request: 422.
    assert_openai_error(post(live.url, chat(), key), 422, "idempotency_key_reused")


def test_stream_replay_is_byte_for_byte_and_a_valid_stream(live: LiveServer) -> None:
    key = new_key()
    body = chat(24, stream=True, stream_options={"include_usage": True})
    first = post(live.url, body, key)
    replay = post(live.url, body, key)
    assert first.status_code == replay.status_code == 200
    assert replay.content == first.content
    assert replay.headers["idempotent-replayed"] == "true"
    for name, value in (("content-type", "text/event-stream"), ("cache-control", "no-store")):
        assert replay.headers[name].startswith(value)
        assert replay.headers[name] == first.headers[name]
    events = data_lines(replay.content)
    assert events[-1] == "[DONE]"
    assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])
    # The SDK reads the replayed stream like any other.
    chunks = list(sdk(live).chat.completions.create(**sdk_args(body, key)))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert chunks[-1].usage is not None


def test_a_key_in_use_gets_409_and_the_sdk_a_conflict_error(live: LiveServer) -> None:
    key = new_key()
    body = chat(LONG, stream=True, ignore_eos=True)
    with running_stream(live, body, key):
        conflict = post(live.url, body, key)
        assert_openai_error(conflict, 409, "idempotency_key_in_use")
        assert conflict.headers["retry-after"] == "1"
        with pytest.raises(openai.ConflictError) as info:
            sdk(live).chat.completions.create(**sdk_args(body, key))
        assert info.value.code == "idempotency_key_in_use"
        # A different request under the running key: 422, not 409.
        assert_openai_error(post(live.url, chat(3), key), 422, "idempotency_key_reused")


def test_the_sdk_retries_409_until_it_gets_the_stored_result(live: LiveServer) -> None:
    key = new_key()
    body = chat(150, ignore_eos=True)
    statuses: list[int] = []
    hooked = httpx.Client(event_hooks={"response": [lambda response: statuses.append(response.status_code)]})
    client = sdk(live, max_retries=2, http_client=hooked)  # the SDK's default retries
    first: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: first.append(post(live.url, body, key)))
    thread.start()
    deadline = time.monotonic() + 5
    while live.engine.core.num_running == 0:  # the first request is generating
        assert time.monotonic() < deadline
        time.sleep(0.002)
    started = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(**sdk_args(body, key))
    thread.join()
    assert statuses[0] == 409, statuses
    assert statuses[-1] == 200, statuses
    assert raw.headers.get("idempotent-replayed") == "true", (statuses, time.monotonic() - started)
    assert raw.http_response.content == first[0].content


def test_a_different_body_under_a_finished_key_is_422(live: LiveServer) -> None:
    key = new_key()
    assert post(live.url, chat(4), key).status_code == 200
    assert_openai_error(post(live.url, chat(5), key), 422, "idempotency_key_reused")
    with pytest.raises(openai.UnprocessableEntityError):
        sdk(live).chat.completions.create(**sdk_args(chat(5), key))


def test_keys_must_be_1_to_255_characters(live: LiveServer) -> None:
    assert post(live.url, chat(2), "k" * 255).status_code == 200
    for bad in ("k" * 256, ""):
        assert_openai_error(post(live.url, chat(2), bad), 400, "invalid_idempotency_key")
    with pytest.raises(openai.BadRequestError):
        sdk(live).chat.completions.create(**sdk_args(chat(2), "k" * 256))


def test_503_and_500_are_not_stored_and_the_retry_runs(live: LiveServer) -> None:
    key = new_key()
    live.state.is_shutting_down = True  # what the lifespan sets when the server stops
    try:
        unavailable = post(live.url, chat(), key)
    finally:
        live.state.is_shutting_down = False
    assert unavailable.status_code == 503 and unavailable.headers["retry-after"]
    runner = live.engine.core.runner

    def failing_forward(*args: object) -> None:
        raise RuntimeError("injected forward failure")

    runner.forward = failing_forward  # type: ignore[method-assign]
    try:
        failed = post(live.url, chat(), key)
        failed_stream = post(live.url, chat(stream=True), stream_key := new_key())
    finally:
        del runner.forward  # the class's own method again
    assert failed.status_code == 500
    assert failed_stream.status_code == 200 and '"error"' in failed_stream.text  # an in-stream error
    for retry_key, body in ((key, chat()), (stream_key, chat(stream=True))):
        retry = post(live.url, body, retry_key)
        assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers
        assert '"error"' not in retry.text
        assert post(live.url, body, retry_key).content == retry.content


def test_a_client_disconnect_mid_stream_releases_the_key(live: LiveServer) -> None:
    key = new_key()
    body = chat(LONG, stream=True, ignore_eos=True)
    aborted = live.engine.core.num_aborted
    with running_stream(live, body, key):
        pass
    live.wait_idle()
    assert live.engine.core.num_aborted == aborted + 1
    deadline = time.monotonic() + 3
    while (retry := post(live.url, chat(3, stream=True), key)).status_code == 422:  # still held
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers


def test_without_a_key_nothing_is_stored(live: LiveServer) -> None:
    first, second = post(live.url, chat(), None), post(live.url, chat(), None)
    assert first.status_code == second.status_code == 200
    assert first.json()["id"] != second.json()["id"]
    assert "idempotent-replayed" not in second.headers


def test_two_replicas_sharing_redis_run_a_key_once(tiny_model_dir: Path, redis_url: str) -> None:
    settings = {"max_model_len": 256, "max_num_seqs": 8, "redis_url": redis_url, "redis_timeout_ms": REDIS_TIMEOUT_MS}
    with running_server(tiny_model_dir, **settings) as one, running_server(tiny_model_dir, **settings) as two:
        for server in (one, two):  # load the Lua scripts and open a connection first
            assert post(server.url, chat(1), new_key()).status_code == 200
        submits = [0]
        for server in (one, two):
            engine = server.engine
            engine.submit = _counting(engine.submit, submits)  # type: ignore[method-assign]
        key, body = new_key(), chat(64, ignore_eos=True)

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as http:
                return await asyncio.gather(
                    *(
                        http.post((one, two)[i % 2].url + CHAT, json=body, headers={"Idempotency-Key": key})
                        for i in range(50)
                    )
                )

        responses = asyncio.run(burst())
        assert {r.status_code for r in responses} <= {200, 409}
        ran = [r for r in responses if r.status_code == 200 and "idempotent-replayed" not in r.headers]
        assert len(ran) == 1
        assert submits == [1]
        assert len({r.content for r in responses if r.status_code == 200}) == 1
        for server in (one, two):  # afterwards both replicas replay the one result
            replay = post(server.url, body, key)
            assert replay.headers["idempotent-replayed"] == "true" and replay.content == ran[0].content
        assert submits == [1]


def _counting(submit: Any, counter: list[int]) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return submit(*args, **kwargs)

    return counted


def test_redis_down_idempotent_requests_get_503_the_rest_keep_working(tiny_model_dir: Path) -> None:
    settings = {"max_model_len": 256, "redis_timeout_ms": REDIS_TIMEOUT_MS}
    with RedisServer() as redis, running_server(tiny_model_dir, redis_url=redis.url, **settings) as live:
        assert post(live.url, chat(2), new_key()).status_code == 200
        redis.kill()
        for _ in range(3):  # each answered at once (a request waiting on the dead Redis times out)
            down = post(live.url, chat(2), new_key(), timeout=5)
            assert down.status_code == 503
            assert down.headers["retry-after"] == "1"
            assert down.json()["error"]["code"] == "idempotency_store_unavailable"
            assert post(live.url, chat(2), None, timeout=5).status_code == 200
        redis.start()
        deadline = time.monotonic() + 5
        while (back := post(live.url, chat(2), new_key(), timeout=5)).status_code == 503:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert back.status_code == 200


def test_an_oversized_body_is_413_before_any_claim(live: LiveServer) -> None:
    key = new_key()
    huge = chat(messages=[{"role": "user", "content": "x" * (9 * 1024 * 1024)}])
    with pytest.raises(openai.APIStatusError) as info:
        sdk(live).chat.completions.create(**sdk_args(huge, key))
    assert info.value.status_code == 413
    assert post(live.url, chat(), key).status_code == 200  # the key was never claimed


def test_a_response_too_large_to_store_replays_as_a_clear_422(tiny_model_dir: Path) -> None:
    """The attack: one huge reply (n x max_tokens x top_logprobs) buffered whole and written to
    Redis in one command, holding it for every tenant. Past --idempotency-max-bytes nothing of it
    is kept; the key stores a small 422 saying why a retry cannot be replayed."""
    with running_server(tiny_model_dir, max_model_len=1024, idempotency_max_bytes=2048) as live:
        key = new_key()
        big = chat(300, ignore_eos=True, stream=True)
        first = post(live.url, big, key)
        assert first.status_code == 200 and len(first.content) > 2048 and first.text.endswith("data: [DONE]\n\n")
        retry = post(live.url, big, key)
        assert retry.status_code == 422, retry.text
        assert retry.json()["error"]["code"] == "idempotency_response_too_large"
        assert retry.headers["idempotent-replayed"] == "true"
        small_key = new_key()
        small = post(live.url, chat(2), small_key)
        assert post(live.url, chat(2), small_key).content == small.content  # within the cap: replayed


@pytest.mark.parametrize("store", ["redis"])  # both stores' quotas: test_store.py; one server here
def test_one_tenants_unique_keys_cannot_evict_another_tenants_replays(
    store: str, tiny_model_dir: Path, request: pytest.FixtureRequest
) -> None:
    """The finding: every tenant's keys were one pool, so one tenant's cheap 4xx requests with
    unique keys evicted everyone's stored replays. Each API key now has a quota; past it the
    flooder loses its own oldest keys, and the other tenant's retry is still replayed."""
    settings: dict[str, Any] = {"api_key": ("sk-victim", "sk-flooder"), "idempotency_max_keys_per_tenant": 5}
    if store == "redis":
        settings.update(redis_url=request.getfixturevalue("redis_server").url, redis_timeout_ms=REDIS_TIMEOUT_MS)

    def send(url: str, api_key: str, body: dict[str, Any], key: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": key}
        return httpx.post(url + CHAT, json=body, headers=headers, timeout=30)

    with running_server(tiny_model_dir, max_model_len=256, dedup_ttl_seconds=0, **settings) as live:
        victim_key = new_key()
        first = send(live.url, "sk-victim", chat(), victim_key)
        assert first.status_code == 200
        flood = [new_key() for _ in range(30)]
        for key in flood:  # a 400 is stored too (it is the answer to that body): cheap to send
            assert send(live.url, "sk-flooder", {"model": MODEL_NAME, "messages": []}, key).status_code == 400
        replay = send(live.url, "sk-victim", chat(), victim_key)
        assert replay.headers.get("idempotent-replayed") == "true"
        assert replay.content == first.content
        # The flooder's own: the oldest were evicted (their retries run again), the newest replay.
        assert (
            "idempotent-replayed"
            not in send(live.url, "sk-flooder", {"model": MODEL_NAME, "messages": []}, flood[0]).headers
        )
        assert (
            send(live.url, "sk-flooder", {"model": MODEL_NAME, "messages": []}, flood[-1]).headers[
                "idempotent-replayed"
            ]
            == "true"
        )
