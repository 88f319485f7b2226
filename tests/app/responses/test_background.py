"""`background: true` through a real server and the openai SDK: queued at once, polled to its end,
cancelled (its engine work stopped), never another key's; `item_reference` inputs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.app.responses.polling import poll
from tests.live_server import MODEL_NAME, LiveServer, running_server
from tests.openai_wire import assert_openai

KEY_A, KEY_B = "sk-background-a-01", "sk-background-b-02"
MAX_MODEL_LEN = 4096
# Long enough to be cancelled while it runs (thousands of tokens of the tiny model: seconds).
LONG: dict[str, Any] = {"max_output_tokens": MAX_MODEL_LEN - 64, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=MAX_MODEL_LEN, api_key=(KEY_A, KEY_B)) as live:
        yield live


def client(server: LiveServer, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def test_a_background_response_is_queued_at_once_and_polled_to_its_end(server: LiveServer) -> None:
    sdk = client(server)
    created = sdk.responses.create(model=MODEL_NAME, input="Tell a story.", background=True, max_output_tokens=8)
    assert created.status == "queued" and created.background and created.output == []
    assert_openai(created.model_dump(mode="json", exclude_unset=True), "Response")
    done = poll(sdk, created.id)
    assert done.status in ("completed", "incomplete") and done.background and done.output
    assert done.usage is not None and done.usage.output_tokens >= 1
    assert_openai(httpx.get(f"{server.url}/v1/responses/{created.id}", headers=auth()).json(), "Response")
    assert sdk.responses.cancel(created.id).status == done.status  # finished: answered as it is
    # It continues as any stored response does.
    follow = sdk.responses.create(
        model=MODEL_NAME, input="And then?", previous_response_id=created.id, max_output_tokens=2
    )
    assert follow.status in ("completed", "incomplete")


def test_cancel_stops_the_run_and_its_engine_work(server: LiveServer) -> None:
    sdk = client(server)
    created = sdk.responses.create(model=MODEL_NAME, input="Go on and on.", background=True, **LONG)
    other = client(server, KEY_B)  # another key neither sees nor cancels it
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.cancel(created.id)
    cancelled = sdk.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    server.wait_idle()  # the engine's requests were aborted, not left to run 4,000 tokens
    time.sleep(0.2)
    assert sdk.responses.retrieve(created.id).status == "cancelled"
    assert sdk.responses.cancel(created.id).status == "cancelled"  # idempotent


def test_deleting_a_running_background_response_stops_it(server: LiveServer) -> None:
    sdk = client(server)
    created = sdk.responses.create(model=MODEL_NAME, input="Go on.", background=True, **LONG)
    sdk.responses.delete(created.id)
    server.wait_idle()
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)


def test_what_a_background_response_cannot_be_is_a_400_before_anything_runs(server: LiveServer) -> None:
    sdk = client(server)
    for extra, param in (({"store": False}, "background"), ({"stream": True}, "stream")):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.create(model=MODEL_NAME, input="x", background=True, **extra)  # type: ignore[call-overload]
        assert refused.value.body["param"] == param  # type: ignore[index]
    plain = sdk.responses.create(model=MODEL_NAME, input="x", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="synchronous"):
        sdk.responses.cancel(plain.id)
    streamed = httpx.get(f"{server.url}/v1/responses/{plain.id}?stream=true", headers=auth())
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"


def test_an_item_reference_names_an_item_of_the_chain(server: LiveServer) -> None:
    sdk = client(server)
    first = sdk.responses.create(model=MODEL_NAME, input="Remember: blue.", max_output_tokens=3)
    items = sdk.responses.input_items.list(first.id).data
    reference: Any = [{"type": "item_reference", "id": items[0].id}, {"role": "user", "content": "Again?"}]
    again = sdk.responses.create(model=MODEL_NAME, input=reference, previous_response_id=first.id, max_output_tokens=2)
    listed = sdk.responses.input_items.list(again.id, order="asc").data
    assert listed[0].id == items[0].id and listed[0].content[0].text == "Remember: blue."  # type: ignore[union-attr]
    unknown: Any = [{"type": "item_reference", "id": "msg_nothing"}]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL_NAME, input=unknown, previous_response_id=first.id)
    assert refused.value.body["param"] == "input[0].id"  # type: ignore[index]


def auth(key: str = KEY_A) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_a_background_run_keeps_its_keys_concurrency_place_until_it_ends(tiny_model_dir: Path) -> None:
    settings: dict[str, Any] = {"max_model_len": MAX_MODEL_LEN, "api_key": (KEY_A, KEY_B), "max_concurrent_per_key": 1}
    with running_server(tiny_model_dir, **settings) as live:
        sdk = client(live)
        running = sdk.responses.create(model=MODEL_NAME, input="Go on.", background=True, **LONG)
        with pytest.raises(openai.RateLimitError):  # the run holds the key's one place
            sdk.responses.create(model=MODEL_NAME, input="Meanwhile?", max_output_tokens=2)
        assert client(live, KEY_B).responses.create(model=MODEL_NAME, input="Other key.", max_output_tokens=2)
        sdk.responses.cancel(running.id)
        live.wait_idle()
        assert sdk.responses.create(model=MODEL_NAME, input="Now?", max_output_tokens=2).status
