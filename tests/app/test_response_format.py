"""response_format through the real server, with the openai SDK and raw SSE: every reply of the
random tiny model matches its schema at temperature 1, and what cannot be enforced is a 400."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.live_server import MODEL_NAME, LiveServer

USER = [{"role": "user", "content": "Describe a city as JSON."}]
CITY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999},
        "coastal": {"type": "boolean"},
        "region": {"$ref": "#/$defs/region"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "tags": {"type": "array", "items": {"enum": ["old", "new", "big"]}, "minItems": 1, "maxItems": 2},
        "mayor": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 6}]},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["name", "population", "coastal", "region", "code", "tags", "mayor", "ratio"],
    "additionalProperties": False,
    "$defs": {"region": {"enum": ["north", "south"]}},
}


def json_schema(schema: dict[str, Any], name: str = "city", **extra: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True, **extra}}


def post(server: LiveServer, path: str = "/v1/chat/completions", **body: Any) -> httpx.Response:
    payload = {"model": MODEL_NAME, "messages": USER, **body}
    if path.endswith("/completions") and "chat" not in path:
        payload.pop("messages")
        payload.setdefault("prompt", "A city:")
    return httpx.post(f"{server.url}{path}", json=payload, timeout=60)


@pytest.mark.parametrize("seed", range(5))
def test_replies_match_the_schema_at_temperature_one(client: openai.OpenAI, seed: int) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME,
        messages=USER,  # type: ignore[arg-type]
        temperature=1.0,
        seed=seed,
        max_tokens=200,
        response_format=json_schema(CITY),  # type: ignore[arg-type]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content or ""), CITY)


def test_n_choices_each_match_and_differ(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME,
        messages=USER,  # type: ignore[arg-type]
        n=3,
        seed=7,
        max_tokens=200,
        response_format=json_schema(CITY),  # type: ignore[arg-type]
    )
    documents = [json.loads(choice.message.content or "") for choice in reply.choices]
    for document in documents:
        jsonschema.validate(document, CITY)
    assert len({json.dumps(document) for document in documents}) > 1


def test_a_streamed_reply_is_the_same_document(client: openai.OpenAI, server: LiveServer) -> None:
    request: dict[str, Any] = {"seed": 3, "max_tokens": 200, "response_format": json_schema(CITY)}
    whole = post(server, **request).json()["choices"][0]["message"]["content"]
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=USER,  # type: ignore[arg-type]
        stream=True,
        extra_headers={"Cache-Control": "no-cache"},  # a generation of its own, not the dedup cache's
        **request,
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    jsonschema.validate(json.loads(whole), CITY)


def test_json_object_mode_writes_an_object(server: LiveServer) -> None:
    for seed in range(3):
        body = post(server, seed=seed, max_tokens=300, response_format={"type": "json_object"}).json()
        content = body["choices"][0]["message"]["content"]
        if body["choices"][0]["finish_reason"] == "length":
            assert content.startswith("{")  # cut short: a prefix of an object
        else:
            assert isinstance(json.loads(content), dict)


def test_text_is_no_constraint(server: LiveServer) -> None:
    plain = post(server, seed=1, max_tokens=8, ignore_eos=True).json()
    text = post(server, seed=1, max_tokens=8, ignore_eos=True, response_format={"type": "text"}).json()
    assert text["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


def test_the_schema_is_part_of_the_dedup_key(server: LiveServer) -> None:
    a = {"type": "object", "properties": {"a": {"const": "first"}}, "required": ["a"], "additionalProperties": False}
    b = {"type": "object", "properties": {"b": {"const": "second"}}, "required": ["b"], "additionalProperties": False}
    first = post(server, temperature=0, max_tokens=20, response_format=json_schema(a, "x"))
    second = post(server, temperature=0, max_tokens=20, response_format=json_schema(b, "x"))
    assert json.loads(first.json()["choices"][0]["message"]["content"]) == {"a": "first"}
    assert json.loads(second.json()["choices"][0]["message"]["content"]) == {"b": "second"}


def test_max_tokens_cuts_with_length(server: LiveServer) -> None:
    body = post(server, seed=2, max_tokens=4, response_format=json_schema(CITY)).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4
    assert body["choices"][0]["message"]["content"].startswith('{"')


def test_logprobs_and_stop_work_under_a_schema(server: LiveServer) -> None:
    body = post(server, seed=5, max_tokens=200, logprobs=True, top_logprobs=2, response_format=json_schema(CITY))
    choice = body.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert b"".join(bytes(entry["bytes"]) for entry in content).decode() == choice["message"]["content"]
    assert all(len(entry["top_logprobs"]) == 2 for entry in content)
    cut = post(server, seed=5, max_tokens=200, stop=['"population"'], response_format=json_schema(CITY)).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["message"]["content"].startswith('{"name": "')
    assert '"population"' not in cut["choices"][0]["message"]["content"]


def test_legacy_completions_take_a_response_format(server: LiveServer) -> None:
    body = post(server, "/v1/completions", seed=4, max_tokens=200, response_format=json_schema(CITY)).json()
    jsonschema.validate(json.loads(body["choices"][0]["text"]), CITY)


class Weather(BaseModel):
    city: Literal["Oslo", "Lima", "Pune"]
    degrees: int = Field(ge=-40, le=50)
    windy: bool


def test_the_sdk_parse_helper_returns_the_model(client: openai.OpenAI) -> None:
    for seed in range(3):
        completion = client.chat.completions.parse(
            model=MODEL_NAME,
            messages=USER,  # type: ignore[arg-type]
            seed=seed,
            max_tokens=100,
            response_format=Weather,
        )
        parsed = completion.choices[0].message.parsed
        assert isinstance(parsed, Weather) and -40 <= parsed.degrees <= 50


@pytest.mark.parametrize(
    ("response_format", "param", "named"),
    [
        (json_schema({"type": "array", "uniqueItems": True}), "response_format", "uniqueItems"),
        (json_schema({"type": "string", "format": "colour"}), "response_format", "colour"),
        (json_schema({"type": "string", "pattern": "(("}), "response_format", "unclosed group"),
        (json_schema({"$ref": "#/$defs/gone"}), "response_format", "/$defs/gone"),
        (json_schema({"type": "integer", "minimum": "low"}), "response_format", "minimum"),
        (
            {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}},
            "response_format.json_schema.name",
            "name",
        ),
        ({"type": "json_schema"}, "response_format", "json_schema"),
        ({"type": "xml"}, "response_format.type", "type"),
        ("json", "response_format", "response_format"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_what_cannot_be_enforced_is_a_400_before_any_stream(
    server: LiveServer, response_format: Any, param: str, named: str, stream: bool
) -> None:
    response = post(server, max_tokens=10, stream=stream, response_format=response_format)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert named in error["message"]
