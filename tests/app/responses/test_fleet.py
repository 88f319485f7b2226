"""Stored responses in a real Redis, shared by two real servers: a chain started on one replica
continues on the other, reads, deletes and cancels reach across them, never across keys, within
the bounds per key; with Redis gone a replica keeps what it stores itself and says 503, not 404,
for what it cannot read."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from scripts.harness.redis_server import RedisServer
from tests.app.responses.polling import poll
from tests.live_server import MODEL_NAME, LiveServer, running_server

KEY_A, KEY_B = "sk-fleet-tenant-a-01", "sk-fleet-tenant-b-02"
MAX_ENTRIES = 3
MAX_MODEL_LEN = 4096
LONG: dict[str, Any] = {"max_output_tokens": MAX_MODEL_LEN - 64, "extra_body": {"ignore_eos": True}}


def settings(redis_url: str) -> dict[str, Any]:
    return {
        "max_model_len": MAX_MODEL_LEN,
        "api_key": (KEY_A, KEY_B),
        "redis_url": redis_url,
        "responses_store_max_entries": MAX_ENTRIES,
    }


@pytest.fixture
def fleet(tiny_model_dir: Path, redis_url: str) -> Iterator[tuple[LiveServer, LiveServer]]:
    with (
        running_server(tiny_model_dir, **settings(redis_url)) as one,
        running_server(tiny_model_dir, **settings(redis_url)) as two,
    ):
        yield one, two


def client(server: LiveServer, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def test_a_chain_started_on_one_replica_continues_on_the_other(
    fleet: tuple[LiveServer, LiveServer], redis_url: str
) -> None:
    one, two = fleet
    first = client(one).responses.create(model=MODEL_NAME, input="My name is Ada.", max_output_tokens=4)
    on_two = client(two).responses.retrieve(first.id)
    assert on_two.model_dump() == first.model_dump()
    second = client(two).responses.create(
        model=MODEL_NAME, input="What is my name?", previous_response_id=first.id, max_output_tokens=4
    )
    assert second.usage is not None and second.usage.input_tokens > first.usage.input_tokens  # type: ignore[union-attr]
    items = client(one).responses.input_items.list(second.id, order="asc").data
    assert [item.content[0].text for item in items] == ["What is my name?"]  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):  # another key, on either replica
        client(one, KEY_B).responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client(two, KEY_B).responses.create(model=MODEL_NAME, input="x", previous_response_id=first.id)
    client(one).responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client(two).responses.retrieve(first.id)
    # No API key in Redis's key names (KEYS and MONITOR show them to whoever runs the Redis).
    names = [name.decode() for name in redis.Redis.from_url(redis_url).keys("*")]
    assert names and not any(KEY_A in name or KEY_B in name for name in names)


def test_a_key_past_its_bound_loses_its_own_oldest_in_redis_never_anothers(
    fleet: tuple[LiveServer, LiveServer],
) -> None:
    one, two = fleet
    kept_by_b = client(two, KEY_B).responses.create(model=MODEL_NAME, input="b", max_output_tokens=1)
    ids = [
        client(one if i % 2 else two).responses.create(model=MODEL_NAME, input=f"a{i}", max_output_tokens=1).id
        for i in range(MAX_ENTRIES + 2)
    ]
    for gone in ids[:2]:
        with pytest.raises(openai.NotFoundError):
            client(one).responses.retrieve(gone)
    assert [client(two).responses.retrieve(kept).id for kept in ids[2:]] == ids[2:]
    assert client(one, KEY_B).responses.retrieve(kept_by_b.id).id == kept_by_b.id


def test_a_background_response_is_polled_and_cancelled_from_the_other_replica(
    fleet: tuple[LiveServer, LiveServer],
) -> None:
    one, two = fleet
    short = client(one).responses.create(model=MODEL_NAME, input="Hi.", background=True, max_output_tokens=4)
    assert poll(client(two), short.id).status in ("completed", "incomplete")

    running = client(one).responses.create(model=MODEL_NAME, input="Go on.", background=True, **LONG)
    with pytest.raises(openai.NotFoundError):
        client(two, KEY_B).responses.cancel(running.id)
    assert client(two).responses.cancel(running.id).status == "cancelled"
    one.wait_idle(timeout=10.0)  # replica one found the mark and aborted its engine work
    time.sleep(0.2)
    assert client(one).responses.retrieve(running.id).status == "cancelled"

    deleted = client(one).responses.create(model=MODEL_NAME, input="Go on.", background=True, **LONG)
    client(two).responses.delete(deleted.id)
    one.wait_idle(timeout=10.0)  # deleted elsewhere: stopped too, and never stored again
    time.sleep(0.2)
    with pytest.raises(openai.NotFoundError):
        client(one).responses.retrieve(deleted.id)


def test_with_redis_gone_a_replica_keeps_its_own_and_answers_503_for_what_it_cannot_read(
    tiny_model_dir: Path,
) -> None:
    with RedisServer() as own_redis:
        extra = {"redis_timeout_ms": 100, "redis_connect_attempts": 1}
        with (
            running_server(tiny_model_dir, **settings(own_redis.url), **extra) as one,
            running_server(tiny_model_dir, **settings(own_redis.url), **extra) as two,
        ):
            shared = client(one).responses.create(model=MODEL_NAME, input="Before.", max_output_tokens=1)
            own_redis.stop()
            local = client(one).responses.create(model=MODEL_NAME, input="During.", max_output_tokens=1)
            assert client(one).responses.retrieve(local.id).id == local.id  # this replica's memory
            follow = client(one).responses.create(
                model=MODEL_NAME, input="More.", previous_response_id=local.id, max_output_tokens=1
            )
            assert follow.previous_response_id == local.id
            with pytest.raises(openai.InternalServerError) as unavailable:
                client(two).responses.retrieve(shared.id)
            assert unavailable.value.status_code == 503


def test_a_replica_that_shuts_down_mid_run_stores_its_background_response_as_failed(
    tiny_model_dir: Path, redis_url: str
) -> None:
    with running_server(tiny_model_dir, **settings(redis_url)) as two:
        with running_server(tiny_model_dir, **settings(redis_url)) as one:
            running = client(one).responses.create(model=MODEL_NAME, input="Go on.", background=True, **LONG)
            assert client(two).responses.retrieve(running.id).status == "queued"
        failed = client(two).responses.retrieve(running.id)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error" and "shut down" in failed.error.message


def test_a_key_past_its_bytes_in_redis_loses_its_own_oldest(tiny_model_dir: Path, redis_url: str) -> None:
    with running_server(tiny_model_dir, **{**settings(redis_url), "responses_store_max_bytes": 6000}) as one:
        sdk = client(one)
        ids = [sdk.responses.create(model=MODEL_NAME, input=f"turn {i}", max_output_tokens=1).id for i in range(6)]
        kept = []
        for response_id in ids:
            with contextlib.suppress(openai.NotFoundError):
                kept.append(sdk.responses.retrieve(response_id).id)
        assert 0 < len(kept) < len(ids) and kept == ids[len(ids) - len(kept) :]  # the newest, in order
        total = redis.Redis.from_url(redis_url).hget(next(iter(bytes_keys(redis_url))), "#total")
        assert total is not None and int(total) <= 6000


def bytes_keys(redis_url: str) -> list[bytes]:
    return list(redis.Redis.from_url(redis_url).scan_iter("surge:responses-tenant-bytes:*"))
