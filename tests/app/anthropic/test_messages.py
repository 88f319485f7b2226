"""POST /v1/messages through a real server with the `anthropic` SDK: text, tools (whole and
streamed), a tool result round trip, count_tokens, and errors in Anthropic's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.live_server import MODEL_NAME, LiveServer, running_server

KEY = "sk-anthropic-tenant-1"
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}}, "required": ["city"]},
}
USER: Any = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=1024, api_key=(KEY,)) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> anthropic.Anthropic:
    # The SDK sends its key as `x-api-key`.
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def test_a_message_and_its_usage(client: anthropic.Anthropic) -> None:
    reply = client.messages.create(
        model=MODEL_NAME,
        max_tokens=8,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=USER,
        metadata={"user_id": "u-1"},
        extra_body={"top_k": 40},
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"},
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [block.type for block in reply.content] == ["text"]
    assert reply.usage.output_tokens <= 8 and reply.usage.input_tokens > 0
    assert reply.stop_reason in ("max_tokens", "end_turn")


def test_a_streamed_message_joins_to_its_final_form(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL_NAME, max_tokens=10, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text  # type: ignore[union-attr]
    assert final.usage.output_tokens <= 10


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_tool_is_called_with_input_that_fits_its_schema(client: anthropic.Anthropic, stream: bool) -> None:
    request: Any = {
        "model": MODEL_NAME,
        "max_tokens": 60,
        "messages": USER,
        "tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    if stream:
        with client.messages.stream(**request) as events:
            reply = events.get_final_message()
    else:
        reply = client.messages.create(**request)
    assert reply.stop_reason == "tool_use"
    (call,) = [block for block in reply.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER["input_schema"])


def test_a_tool_result_goes_back_and_the_model_answers(client: anthropic.Anthropic) -> None:
    messages: Any = [
        *USER,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should look.", "signature": "sig"},
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    reply = client.messages.create(model=MODEL_NAME, max_tokens=6, messages=messages, tools=[WEATHER])
    assert reply.usage.input_tokens > 0 and reply.content


def test_a_stop_sequence_that_ends_the_reply_is_named(client: anthropic.Anthropic) -> None:
    # This SDK has no `temperature` argument any more; the API still takes it.
    greedy: Any = {"model": MODEL_NAME, "max_tokens": 24, "messages": USER, "extra_body": {"temperature": 0.0}}
    whole = "".join(block.text for block in client.messages.create(**greedy).content if block.type == "text")
    assert len(whole) > 8
    stop = whole[4:7]
    cut = whole[: whole.index(stop)]
    reply = client.messages.create(**greedy, stop_sequences=["never-written-zzz", stop])
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", stop)
    assert "".join(block.text for block in reply.content if block.type == "text") == cut
    with client.messages.stream(**greedy, stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    ended = client.messages.create(**{**greedy, "max_tokens": 2})
    assert (ended.stop_reason, ended.stop_sequence) == ("max_tokens", None)


def test_count_tokens_is_the_prompt_as_a_message_would_render_it(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=MODEL_NAME, messages=USER, tools=[WEATHER])
    reply = client.messages.create(model=MODEL_NAME, max_tokens=1, messages=USER, tools=[WEATHER])
    assert counted.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)


@pytest.mark.parametrize(
    ("status", "kind", "request_body", "headers"),
    [
        (404, "not_found_error", {"model": "nope", "max_tokens": 5, "messages": USER}, {}),
        (400, "invalid_request_error", {"model": MODEL_NAME, "messages": USER}, {}),  # no max_tokens
        (
            400,
            "invalid_request_error",
            {
                "model": MODEL_NAME,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}],
            },
            {},
        ),
        (401, "authentication_error", {"model": MODEL_NAME, "max_tokens": 5, "messages": USER}, {"x-api-key": "bad"}),
    ],
)
def test_errors_come_in_anthropics_shape_before_any_stream(
    server: LiveServer, status: int, kind: str, request_body: dict[str, Any], headers: dict[str, str]
) -> None:
    for stream in (False, True):
        response = httpx.post(
            f"{server.url}/v1/messages",
            json={**request_body, "stream": stream},
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", **headers},
            timeout=30,
        )
        assert response.status_code == status, response.text
        body = response.json()
        assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"], body
        assert set(body) == {"type", "error"}


def test_the_stream_is_anthropics_event_sequence(server: LiveServer) -> None:
    payload = {"model": MODEL_NAME, "max_tokens": 5, "messages": USER, "stream": True}
    with httpx.stream(
        "POST", f"{server.url}/v1/messages", json=payload, headers={"authorization": f"Bearer {KEY}"}, timeout=30
    ) as response:
        assert response.status_code == 200
        lines = list(response.iter_lines())
    names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert [event["type"] for event in events] == names
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) <= {"content_block_delta"}
    assert events[-2]["usage"]["output_tokens"] <= 5 and events[-2]["delta"]["stop_reason"] in (
        "max_tokens",
        "end_turn",
    )
