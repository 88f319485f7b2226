"""POST /v1/responses through a real server: the openai SDK's calls, bodies and every stream event
validated against OpenAI's published schema, tools, text formats, and the fields real clients send."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.live_server import MODEL_NAME, LiveServer
from tests.openai_wire import assert_openai

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}}, "required": ["city"]},
}
IMAGE = {"type": "input_image", "image_url": "https://example.com/a.png"}
BAD = {"type": "nope"}
CHOICE = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"], "additionalProperties": False}


def create(server: LiveServer, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/responses", json={"model": MODEL_NAME, **body}, timeout=60)


def stream_events(server: LiveServer, **body: Any) -> list[dict[str, Any]]:
    payload = {"model": MODEL_NAME, "stream": True, **body}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=payload, timeout=60) as response:
        assert response.status_code == 200, response.read()
        lines = list(response.iter_lines())
    names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert [event["type"] for event in events] == names  # each `event:` line names its data's type
    return events


def check_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every event valid and numbered in order; the final Response, which the deltas add up to."""
    for event in events:
        assert_openai(event, "ResponseStreamEvent")
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events[:2]] == ["response.created", "response.in_progress"]
    final = events[-1]
    assert final["type"] in ("response.completed", "response.incomplete")
    response = final["response"]
    assert_openai(response, "Response")
    done = [event["item"] for event in events if event["type"] == "response.output_item.done"]
    assert done == response["output"]
    for item in response["output"]:
        item_events = [event for event in events if event.get("item_id") == item["id"]]
        if item["type"] == "message":
            deltas = "".join(e["delta"] for e in item_events if e["type"] == "response.output_text.delta")
            assert deltas == item["content"][0]["text"]
        if item["type"] == "function_call":
            deltas = "".join(e["delta"] for e in item_events if e["type"] == "response.function_call_arguments.delta")
            assert deltas == item["arguments"]
    return response


def test_a_plain_response_matches_openais_schema(server: LiveServer) -> None:
    response = create(server, input="Say something.", max_output_tokens=8, instructions="Be brief.", ignore_eos=True)
    assert response.status_code == 200
    body = response.json()
    assert_openai(body, "Response")
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    (message,) = body["output"]
    assert message["type"] == "message" and message["id"].startswith("msg_")
    usage = body["usage"]
    assert usage["output_tokens"] == 8 and usage["total_tokens"] == usage["input_tokens"] + 8
    assert body["instructions"] == "Be brief." and body["max_output_tokens"] == 8  # echoed


def test_the_sdk_creates_and_streams_responses(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL_NAME, input="Hello", max_output_tokens=12, extra_body={"ignore_eos": True}
    )
    assert response.status == "incomplete" and response.output_text
    # A reply that ends on its own (the format's grammar closes it): the SDK's stream helper
    # wants `response.completed`, which a cut reply (`response.incomplete`) does not send.
    text: Any = {"format": {"type": "json_schema", "name": "choice", "schema": CHOICE}}
    with client.responses.stream(model=MODEL_NAME, input="Pick.", text=text, max_output_tokens=40) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and "".join(deltas) == final.output_text
    assert final.usage is not None and final.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_tool_is_called_with_arguments_that_fit_its_schema(server: LiveServer, stream: bool) -> None:
    body = {
        "input": "Weather in Oslo?",
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,  # one call, then the reply ends: never cut mid-call
        "max_output_tokens": 60,
    }
    response = check_stream(stream_events(server, **body)) if stream else create(server, **body).json()
    assert_openai(response, "Response")
    assert response["status"] == "completed"
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert len(calls) == 1, response["output"]
    for call in calls:
        assert call["name"] == "get_weather" and call["call_id"].startswith("call_") and call["id"].startswith("fc_")
        jsonschema.validate(json.loads(call["arguments"]), WEATHER["parameters"])


def test_codex_tools_are_accepted_and_only_functions_offered(server: LiveServer) -> None:
    """Codex's request: tools surge cannot run (custom, web_search, local_shell) sit beside
    functions and namespace groups; its bookkeeping fields ride along. A namespace's function is
    called by its own name, with its namespace."""
    group = {"type": "namespace", "name": "crm", "description": "CRM tools", "tools": [{**WEATHER, "name": "lookup"}]}
    body = {
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Look it up."}]}],
        "instructions": "You are a coding agent.",
        "tools": [
            {"type": "custom", "name": "apply_patch", "description": "Patch files."},
            {"type": "web_search"},
            {"type": "local_shell"},
            group,
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "store": False,
        "stream": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0b6d-session",
        "client_metadata": {"originator": "codex_exec"},
        "text": {"verbosity": "medium"},
        "max_output_tokens": 60,
    }
    response = check_stream(stream_events(server, **body))
    (call,) = [item for item in response["output"] if item["type"] == "function_call"]
    assert call["name"] == "lookup" and call["namespace"] == "crm"


def test_an_earlier_turns_calls_and_outputs_are_input(server: LiveServer) -> None:
    body = {
        "input": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
        "tools": [WEATHER],
        "max_output_tokens": 6,
    }
    response = create(server, **body)
    assert response.status_code == 200, response.text
    assert_openai(response.json(), "Response")


class Choice(BaseModel):
    k: Literal["a", "b"]


def test_text_format_json_schema_is_enforced(client: openai.OpenAI, server: LiveServer) -> None:
    text = {"format": {"type": "json_schema", "name": "choice", "schema": CHOICE, "strict": True}}
    for events in (None, stream_events(server, input="Pick.", text=text, max_output_tokens=30)):
        body = check_stream(events) if events else create(server, input="Pick.", text=text, max_output_tokens=30).json()
        message = next(item for item in body["output"] if item["type"] == "message")
        jsonschema.validate(json.loads(message["content"][0]["text"]), CHOICE)
    parsed = client.responses.parse(model=MODEL_NAME, input="Pick.", text_format=Choice, max_output_tokens=30)
    assert isinstance(parsed.output_parsed, Choice)


def test_a_probe_with_empty_input_and_one_token_is_answered(server: LiveServer) -> None:
    response = create(server, input="", max_output_tokens=1, ignore_eos=True)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["output_tokens"] == 1


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input[0].content[0]",
        ),
        ({"input": "hi", "previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
        ({"input": "hi", "background": True, "store": False}, 400, "background"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input[0].id"),
        ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, 400, "tool_choice"),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
            400,
            "text.format",
        ),
    ],
)
def test_what_surge_cannot_honour_is_a_clear_error_before_any_stream(
    server: LiveServer, body: dict[str, Any], status: int, param: str
) -> None:
    for stream in (False, True):
        response = create(server, **body, stream=stream)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["message"], error
        assert_openai(response.json(), "ErrorResponse")


def test_an_unknown_model_is_a_404(server: LiveServer) -> None:
    response = httpx.post(f"{server.url}/v1/responses", json={"model": "nope", "input": "hi"}, timeout=30)
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
