"""Every body surge sends, checked against OpenAI's own OpenAPI schemas (tests/openai_wire.py):
chat and completions, JSON and each streamed chunk, logprobs, n > 1, usage, models, errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.live_server import MODEL_NAME, LiveServer
from tests.openai_wire import assert_openai, openai_errors

USER = [{"role": "user", "content": "Say something."}]
SCHEMA = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"], "additionalProperties": False}

CHAT_BODIES: dict[str, dict[str, Any]] = {
    "plain": {"max_tokens": 6},
    "logprobs": {"max_tokens": 6, "logprobs": True, "top_logprobs": 3},
    "n": {"max_tokens": 4, "n": 3, "seed": 1},
    "length": {"max_tokens": 3, "ignore_eos": True},
    "json_schema": {
        "max_tokens": 30,
        "response_format": {"type": "json_schema", "json_schema": {"name": "k", "schema": SCHEMA}},
    },
}


def sse_chunks(response: httpx.Response) -> list[Any]:
    data = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def stream(server: LiveServer, path: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as response:
        assert response.status_code == 200
        return sse_chunks(response)


@pytest.mark.parametrize("case", list(CHAT_BODIES))
def test_chat_completions_match_openai(server: LiveServer, case: str) -> None:
    body = {"model": MODEL_NAME, "messages": USER, **CHAT_BODIES[case]}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200
    assert_openai(response.json(), "CreateChatCompletionResponse")


@pytest.mark.parametrize("case", list(CHAT_BODIES))
def test_chat_stream_chunks_match_openai(server: LiveServer, case: str) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": USER,
        "stream": True,
        "stream_options": {"include_usage": True},
        **CHAT_BODIES[case],
    }
    chunks = stream(server, "/v1/chat/completions", body)
    assert len(chunks) >= 3
    for chunk in chunks:
        assert_openai(chunk, "CreateChatCompletionStreamResponse")


COMPLETION_BODIES: dict[str, dict[str, Any]] = {
    "plain": {"prompt": "Once", "max_tokens": 5},
    "logprobs": {"prompt": "Once", "max_tokens": 5, "logprobs": 2},
    "prompts": {"prompt": ["a", "b"], "max_tokens": 3, "n": 2, "seed": 3},
}


@pytest.mark.parametrize("case", list(COMPLETION_BODIES))
def test_completions_match_openai(server: LiveServer, case: str) -> None:
    body = {"model": MODEL_NAME, **COMPLETION_BODIES[case]}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200
    assert_openai(response.json(), "CreateCompletionResponse")
    # OpenAI streams completions as CreateCompletionResponse objects, one per chunk, with
    # `finish_reason: null` until the last (the schema, written for whole responses, has no null).
    finished = set()
    for chunk in stream(server, "/v1/completions", {**body, "stream": True}):
        for choice in chunk["choices"]:
            if choice["finish_reason"] is None:
                choice["finish_reason"] = "length"
            else:
                finished.add(choice["index"])
        assert_openai(chunk, "CreateCompletionResponse")
    assert len(finished) == len(response.json()["choices"])


def test_models_match_openai(server: LiveServer) -> None:
    assert_openai(httpx.get(f"{server.url}/v1/models").json(), "ListModelsResponse")


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {"model": MODEL_NAME, "messages": []}, 400),
        ("/v1/chat/completions", {"model": "nope", "messages": USER}, 404),
        ("/v1/chat/completions", {"model": MODEL_NAME, "messages": USER, "response_format": {"type": "x"}}, 400),
        ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": 0}, 400),
        ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "echo": True}, 400),
        ("/v1/nothing", {}, 404),
    ],
)
def test_errors_match_openai(server: LiveServer, path: str, body: dict[str, Any], status: int) -> None:
    response = httpx.post(f"{server.url}{path}", json=body)
    assert response.status_code == status
    assert_openai(response.json(), "ErrorResponse")


def test_the_validator_can_fail() -> None:
    errors = openai_errors({"object": "chat.completion", "choices": [{"index": 0}]}, "CreateChatCompletionResponse")
    assert any("'id' is a required property" in error for error in errors)
