"""Stored responses through a real server with two API keys: retrieve, delete, input_items,
previous_response_id (a chained turn reuses the prefix cache), never across keys, within bounds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.live_server import MODEL_NAME, LiveServer, running_server
from tests.openai_wire import assert_openai

KEY_A, KEY_B = "sk-tenant-a-0001", "sk-tenant-b-0002"
MAX_ENTRIES = 4
# A format whose grammar closes the reply within a few tokens: a completed Response.
SCHEMA = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"], "additionalProperties": False}
CHOICE: Any = {"type": "json_schema", "name": "choice", "schema": SCHEMA}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    settings: dict[str, Any] = {"api_key": (KEY_A, KEY_B), "responses_store_max_entries": MAX_ENTRIES}
    with running_server(tiny_model_dir, max_model_len=1024, **settings) as live:
        yield live


def client(server: LiveServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def get(server: LiveServer, path: str, key: str) -> httpx.Response:
    return httpx.get(f"{server.url}/v1/responses{path}", headers={"authorization": f"Bearer {key}"}, timeout=30)


def test_a_stored_response_is_retrieved_listed_and_deleted_by_its_key_only(server: LiveServer) -> None:
    a, b = client(server, KEY_A), client(server, KEY_B)
    items = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "First question."}]},
        {"role": "user", "content": "Second question."},
    ]
    created = a.responses.create(model=MODEL_NAME, input=items, max_output_tokens=6, extra_body={"ignore_eos": True})
    assert created.store
    body = get(server, f"/{created.id}", KEY_A)
    assert body.status_code == 200 and body.json() == created.model_dump(mode="json", exclude_unset=True)
    assert_openai(body.json(), "Response")
    assert a.responses.retrieve(created.id).output_text == created.output_text

    listed = a.responses.input_items.list(created.id, order="asc")
    assert [item.type for item in listed.data] == ["message"] * 3
    texts = [item.content[0].text for item in listed.data]  # type: ignore[union-attr]
    assert texts == ["Be brief.", "First question.", "Second question."]
    page = get(server, f"/{created.id}/input_items?limit=2&order=asc", KEY_A).json()
    assert page["has_more"] and len(page["data"]) == 2 and page["last_id"] == listed.data[1].id
    rest = get(server, f"/{created.id}/input_items?limit=2&order=asc&after={page['last_id']}", KEY_A).json()
    assert [item["id"] for item in rest["data"]] == [listed.data[2].id] and not rest["has_more"]

    # Another key: not found for reading, listing, continuing and deleting alike.
    for path in (f"/{created.id}", f"/{created.id}/input_items"):
        response = get(server, path, KEY_B)
        assert response.status_code == 404 and created.id in response.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        b.responses.create(model=MODEL_NAME, input="Go on.", previous_response_id=created.id, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(created.id)

    a.responses.delete(created.id)
    assert get(server, f"/{created.id}", KEY_A).status_code == 404


def test_a_chained_turn_continues_the_conversation_and_reuses_its_prefix(server: LiveServer) -> None:
    a = client(server, KEY_A)
    extra = {"ignore_eos": True}
    long_question = "Tell me about the fjords of Norway. " * 20
    first = a.responses.create(model=MODEL_NAME, input=long_question, max_output_tokens=8, extra_body=extra)
    assert first.usage is not None and first.usage.input_tokens_details.cached_tokens == 0
    second = a.responses.create(
        model=MODEL_NAME, input="And the weather?", previous_response_id=first.id, max_output_tokens=8, extra_body=extra
    )
    assert second.previous_response_id == first.id and second.usage is not None
    # The second prompt holds the first turn (its input and its reply) before the new question.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0  # the first turn's K/V, reused
    # Its own input items are only the new question; the chain lives in the store.
    (item,) = a.responses.input_items.list(second.id).data
    assert item.content[0].text == "And the weather?"  # type: ignore[union-attr]


def test_store_false_keeps_nothing(server: LiveServer) -> None:
    a = client(server, KEY_A)
    response = a.responses.create(model=MODEL_NAME, input="hi", store=False, max_output_tokens=2)
    assert not response.store and get(server, f"/{response.id}", KEY_A).status_code == 404


def test_a_key_past_its_bound_loses_its_own_oldest_never_anothers(server: LiveServer) -> None:
    a, b = client(server, KEY_A), client(server, KEY_B)
    kept_b = b.responses.create(model=MODEL_NAME, input="b's", max_output_tokens=2)
    ids = [a.responses.create(model=MODEL_NAME, input=f"a {i}", max_output_tokens=2).id for i in range(MAX_ENTRIES + 2)]
    assert [get(server, f"/{i}", KEY_A).status_code for i in ids] == [404, 404] + [200] * MAX_ENTRIES
    assert get(server, f"/{kept_b.id}", KEY_B).status_code == 200
    assert server.state.responses.memory.usage(f"key:{KEY_A}")[0] == MAX_ENTRIES


def test_a_streamed_response_is_stored_as_its_last_event_says(server: LiveServer) -> None:
    a = client(server, KEY_A)
    with a.responses.stream(model=MODEL_NAME, input="Pick.", max_output_tokens=30, text={"format": CHOICE}) as stream:
        final = stream.get_final_response()
    stored = get(server, f"/{final.id}", KEY_A)
    assert stored.status_code == 200 and stored.json()["status"] == "completed"
    assert [item["id"] for item in stored.json()["output"]] == [item.id for item in final.output]
    assert stored.json()["output"][0]["content"][0]["text"] == final.output_text
