"""Tool calling through the real server, with the openai SDK and raw SSE, on the random tiny model:
only the grammar can make its calls valid, so every call is checked against its tool's schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from models.loading import tiny
from tests.live_server import MODEL_NAME, LiveServer, running_server
from tests.openai_wire import assert_openai

USER = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER_PARAMETERS},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMETERS, "strict": True}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
# Pushes the random model towards the opening tag, so `auto` calls (then the grammar holds it).
OPEN_TAG_BIAS = {str(tiny.TOOL_CALL_ID): 12}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    """The tools' system prompt alone is about 450 tokens: a longer context than the session server's."""
    with running_server(tiny_model_dir, max_model_len=2048, max_num_seqs=8) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def chat(client: openai.OpenAI, **request: Any) -> Any:
    request.setdefault("messages", USER)
    request.setdefault("max_tokens", 120)
    return client.chat.completions.create(model=MODEL_NAME, tools=TOOLS, **request)  # type: ignore[call-overload]


def check_calls(calls: Any) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("seed", range(4))
def test_required_gives_valid_calls_at_temperature_one(client: openai.OpenAI, seed: int) -> None:
    choice = chat(client, tool_choice="required", temperature=1.0, seed=seed).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    check_calls(choice.message.tool_calls)


def test_a_named_tool_is_called_once_and_finishes_with_stop(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(3):
        choice = chat(client, tool_choice=named, seed=seed).choices[0]
        assert choice.finish_reason == "stop"
        assert [call.function.name for call in choice.message.tool_calls] == ["get_time"]
        check_calls(choice.message.tool_calls)


def test_parallel_tool_calls_false_allows_one_call(client: openai.OpenAI) -> None:
    for seed in range(4):
        calls = chat(client, tool_choice="required", parallel_tool_calls=False, seed=seed).choices[0].message.tool_calls
        assert len(calls) == 1
        check_calls(calls)


def test_auto_answers_in_text_until_the_model_opens_a_call(client: openai.OpenAI) -> None:
    text = chat(client, seed=1, max_tokens=20).choices[0]
    assert text.message.tool_calls is None and text.message.content
    assert "<tool_call>" not in text.message.content
    called = chat(client, seed=1, logit_bias=OPEN_TAG_BIAS).choices[0]
    assert called.finish_reason == "tool_calls"
    check_calls(called.message.tool_calls)


def test_none_never_yields_calls(client: openai.OpenAI) -> None:
    choice = chat(client, tool_choice="none", seed=1, max_tokens=30, logit_bias=OPEN_TAG_BIAS).choices[0]
    assert choice.message.tool_calls is None
    assert choice.message.content and "<tool_call>" in choice.message.content  # the text is kept as text


def test_the_stream_helper_assembles_the_same_calls(client: openai.OpenAI) -> None:
    whole = chat(client, tool_choice="required", seed=5).choices[0].message.tool_calls
    with client.chat.completions.stream(
        model=MODEL_NAME,
        messages=USER,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        seed=5,
        max_tokens=120,
        extra_headers={"Cache-Control": "no-cache"},  # generated again, not replayed by the dedup cache
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls or []] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


def raw_stream(server: LiveServer, **request: Any) -> list[dict[str, Any]]:
    body = {"model": MODEL_NAME, "messages": USER, "tools": TOOLS, "max_tokens": 120, "stream": True, **request}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def test_raw_sse_fragments_follow_openai(server: LiveServer) -> None:
    chunks = raw_stream(server, tool_choice="required", seed=6, stream_options={"include_usage": True})
    for chunk in chunks:
        assert_openai(chunk, "CreateChatCompletionStreamResponse")
    fragments = [call for c in chunks if c["choices"] for call in c["choices"][0]["delta"].get("tool_calls", [])]
    seen: set[int] = set()
    arguments: dict[int, str] = {}
    for fragment in fragments:
        if fragment["index"] not in seen:  # the first: index, id, type, name, empty arguments
            seen.add(fragment["index"])
            assert fragment["id"].startswith("call_") and fragment["type"] == "function"
            assert fragment["function"]["name"] in SCHEMAS and fragment["function"]["arguments"] == ""
            arguments[fragment["index"]] = ""
        else:  # later ones: argument text only
            assert set(fragment) == {"index", "function"} and set(fragment["function"]) == {"arguments"}
            arguments[fragment["index"]] += fragment["function"]["arguments"]
    assert arguments and all(json.loads(text) for text in arguments.values())
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


def test_json_bodies_match_openai(server: LiveServer) -> None:
    for request in ({"tool_choice": "required", "n": 2, "seed": 7}, {"seed": 8, "max_tokens": 10}):
        body = {"model": MODEL_NAME, "messages": USER, "tools": TOOLS, "max_tokens": 120, **request}
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert_openai(response.json(), "CreateChatCompletionResponse")


def test_a_history_with_calls_and_results_renders(client: openai.OpenAI) -> None:
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    ]
    one_turn = chat(client, seed=1, max_tokens=4).usage.prompt_tokens
    reply = chat(client, messages=messages, seed=1, max_tokens=4)
    assert reply.usage.prompt_tokens > one_turn + 20  # the calls and results are in the prompt


class Lookup(BaseModel):
    city: str = Field(max_length=8)
    unit: str = Field(pattern="^(c|f)$")


def test_the_sdk_parses_strict_pydantic_tools(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL_NAME,
        messages=USER,  # type: ignore[arg-type]
        tools=[openai.pydantic_function_tool(Lookup)],
        tool_choice="required",
        seed=3,
        max_tokens=80,
    )
    calls = completion.choices[0].message.tool_calls or []
    assert calls and all(isinstance(call.function.parsed_arguments, Lookup) for call in calls)


def bad_request(server: LiveServer, **request: Any) -> dict[str, Any]:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 5, **request}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return dict(error)


@pytest.mark.parametrize(
    ("request_fields", "param", "named"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name", "pattern"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type", "function"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools", "get_weather"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
        ({"tool_choice": "required"}, "tool_choice", "tools"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "tool_choice"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "u", "parameters": {"type": "array", "uniqueItems": True}},
                    }
                ]
            },
            "tools",
            "uniqueItems",
        ),
        ({"messages": [*USER, {"role": "tool", "content": "x"}]}, "messages.1", "tool_call_id"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_tools_are_a_400_before_any_stream(
    server: LiveServer, request_fields: dict[str, Any], param: str, named: str, stream: bool
) -> None:
    error = bad_request(server, stream=stream, **request_fields)
    assert error["param"] == param
    assert named in error["message"]


@pytest.mark.parametrize("parser", ["llama3_json", "mistral"])
def test_another_format_through_the_server(tiny_model_dir: Path, parser: str) -> None:
    """--tool-call-parser: the grammar writes that format and its parser reads it back."""
    with running_server(tiny_model_dir, max_model_len=2048, max_num_seqs=2, tool_call_parser=parser) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
        for seed in range(2):
            choice = chat(client, tool_choice="required", seed=seed).choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            check_calls(choice.message.tool_calls)
