"""Unit tests of OpenAI's wire format in both of its protocols (chat, legacy completions): request
validation, sampling mapping, chunk JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import openai.types
import openai.types.chat
import pytest
from pydantic import ValidationError

from app.chat.encoder import ChatChunkEncoder
from app.chat.request import ChatCompletionRequest
from app.completions.chunks import CompletionChunkEncoder
from app.completions.request import CompletionRequest
from app.openai import (
    Usage,
    chat_logprob_entry,
    completion_logprobs,
    new_chat_completion_id,
    new_completion_id,
)
from app.server.errors import describe_validation_errors

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def completion(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "hi", **fields})


def rejected_param(model: type[ChatCompletionRequest | CompletionRequest], body: dict[str, Any]) -> str | None:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return describe_validation_errors(info.value.errors())[1]


# -- chat requests


def test_chat_defaults_map_to_engine_defaults() -> None:
    params = chat().to_sampling_params(max_tokens=7)
    assert params.max_tokens == 7
    assert (params.temperature, params.top_p, params.top_k) == (1.0, 1.0, 0)
    assert params.logprobs is None
    assert params.stop == ()
    assert params.logit_bias == {}


def test_chat_sampling_fields_map_to_sampling_params() -> None:
    request = chat(
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        seed=3,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias={"42": -100, "7": 2.5},
        logprobs=True,
        top_logprobs=5,
        stop="END",
        stop_token_ids=[2],
        ignore_eos=True,
        priority=-1,
    )
    params = request.to_sampling_params(max_tokens=10)
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.5, 0.9, 40, 3)
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.5)
    assert params.logit_bias == {42: -100.0, 7: 2.5}
    assert params.logprobs == 5
    assert params.stop == ("END",)
    assert params.stop_token_ids == (2,)
    assert params.ignore_eos is True
    assert request.priority == -1


def test_logprobs_without_top_logprobs_means_zero_alternatives() -> None:
    assert chat(logprobs=True).to_sampling_params(1).logprobs == 0


def test_top_p_zero_means_greedy() -> None:
    params = chat(top_p=0, temperature=0.7).to_sampling_params(1)
    assert params.is_greedy
    assert params.top_p == 1.0


@pytest.mark.parametrize("top_k", [0, -1])
def test_top_k_off_values_follow_vllm(top_k: int) -> None:
    assert chat(top_k=top_k).to_sampling_params(1).top_k == 0


def test_empty_stop_strings_are_dropped() -> None:
    assert chat(stop=["", "x"]).to_sampling_params(1).stop == ("x",)
    assert chat(stop="").to_sampling_params(1).stop == ()


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert chat(max_tokens=5, max_completion_tokens=9).requested_max_tokens == 9
    assert chat(max_tokens=5).requested_max_tokens == 5
    assert chat().requested_max_tokens is None


def test_null_means_default_and_unknown_fields_are_ignored() -> None:
    request = chat(n=None, stream=None, temperature=None, web_search_options={}, future_field=1)
    assert request.n == 1
    assert request.stream is False
    assert request.temperature is None


def test_stream_options_include_usage() -> None:
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage
    assert not chat(stream=True).include_usage


def test_content_parts_and_developer_role_reach_the_template() -> None:
    request = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
        ]
    )
    assert request.template_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": ""},
    ]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"seed": 2**64}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"messages": [{"role": "user"}]}, "messages.0"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content.0.type"),
        ({"model": None}, "model"),
    ],
)
def test_invalid_chat_fields_name_the_param(fields: dict[str, Any], param: str) -> None:
    assert rejected_param(ChatCompletionRequest, {"model": "m", "messages": USER, **fields}) == param


# -- completion requests


@pytest.mark.parametrize(
    ("prompt", "inputs"),
    [
        ("hi", ["hi"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_completion_prompt_shapes(prompt: Any, inputs: list[Any]) -> None:
    assert completion(prompt=prompt).prompt_inputs() == inputs


@pytest.mark.parametrize("prompt", [[], [[]], ["a", 1], [-1], [True], 5])
def test_malformed_prompts_are_rejected(prompt: Any) -> None:
    assert rejected_param(CompletionRequest, {"model": "m", "prompt": prompt}) == "prompt"


def test_completion_max_tokens_defaults_to_16_like_openai() -> None:
    assert completion().requested_max_tokens == 16
    assert completion(max_tokens=None).requested_max_tokens == 16
    assert completion(max_tokens=3).requested_max_tokens == 3


def test_completion_logprobs_is_the_number_of_alternatives() -> None:
    assert completion(logprobs=0).to_sampling_params(1).logprobs == 0
    assert completion(logprobs=20).to_sampling_params(1).logprobs == 20
    assert completion().to_sampling_params(1).logprobs is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"echo": True}, "echo"), ({"suffix": "tail"}, "suffix"), ({"logprobs": 21}, "logprobs")],
)
def test_unsupported_completion_fields_are_rejected(fields: dict[str, Any], param: str) -> None:
    assert rejected_param(CompletionRequest, {"model": "m", "prompt": "x", **fields}) == param


def test_harmless_echo_and_suffix_values_are_accepted() -> None:
    request = completion(echo=False, suffix="")
    assert request.echo is False


# -- responses


def test_ids_have_openai_prefixes_and_are_unique() -> None:
    assert new_chat_completion_id().startswith("chatcmpl-")
    assert new_completion_id().startswith("cmpl-")
    assert new_completion_id() != new_completion_id()


# -- streaming chunks


def strict_loads(text: str) -> Any:
    """json.loads that refuses NaN/Infinity, which are not JSON."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_chat_chunks_match_openai_shape() -> None:
    encoder = ChatChunkEncoder(completion_id="chatcmpl-1", model="m", created=9)
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 9, "model": "m"}
    assert strict_loads(encoder.role(0)) == {
        **head,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
    }
    assert strict_loads(encoder.delta(1, 'é "q"\n')) == {
        **head,
        "choices": [{"index": 1, "delta": {"content": 'é "q"\n'}, "logprobs": None, "finish_reason": None}],
    }
    assert strict_loads(encoder.delta(0, None, finish_reason="length"))["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    ]


def test_chat_chunks_with_usage_and_logprobs_parse_in_the_sdk() -> None:
    encoder = ChatChunkEncoder(completion_id="chatcmpl-1", model="m", created=9, include_usage=True)
    entry = chat_logprob_entry("hi", -0.5, top=[("hi", -0.5), ("yo", -math.inf)])
    chunks = [
        encoder.role(0),
        encoder.delta(0, "hi", logprobs=[entry]),
        encoder.delta(0, None, finish_reason="stop"),
        encoder.usage(Usage.of(4, 1, 2)),
    ]
    bodies = [strict_loads(chunk) for chunk in chunks]
    assert [body["usage"] for body in bodies[:3]] == [None, None, None]
    assert bodies[3]["choices"] == []
    assert bodies[3]["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 1,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    logprobs = bodies[1]["choices"][0]["logprobs"]["content"][0]
    assert logprobs == {
        "token": "hi",
        "logprob": -0.5,
        "bytes": [104, 105],
        "top_logprobs": [
            {"token": "hi", "logprob": -0.5, "bytes": [104, 105]},
            {"token": "yo", "logprob": -9999.0, "bytes": [121, 111]},
        ],
    }
    for chunk in chunks:
        sdk = openai.types.chat.ChatCompletionChunk.model_validate(strict_loads(chunk))
        assert sdk.id == "chatcmpl-1"


def test_completion_chunks_match_openai_shape() -> None:
    encoder = CompletionChunkEncoder(completion_id="cmpl-1", model="m", created=9, include_usage=True)
    logprobs = completion_logprobs(["a", "b"], [-0.1, -math.inf], [[("a", -0.1)], [("b", -0.2)]], [0, 1])
    chunk = encoder.text(2, "ab", logprobs=logprobs, finish_reason="stop")
    assert strict_loads(chunk) == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 9,
        "model": "m",
        "choices": [
            {
                "index": 2,
                "text": "ab",
                "logprobs": {
                    "tokens": ["a", "b"],
                    "token_logprobs": [-0.1, -9999.0],
                    "top_logprobs": [{"a": -0.1}, {"b": -0.2}],
                    "text_offset": [0, 1],
                },
                "finish_reason": "stop",
            }
        ],
        "usage": None,
    }
    # The SDK reuses its non-streaming `Completion` type (finish_reason required) for chunks,
    # and parses them without validation; only the finished chunk passes its strict check.
    openai.types.Completion.model_validate(strict_loads(chunk))
    for text in (encoder.text(0, "x"), encoder.usage(Usage.of(1, 1))):
        body = strict_loads(text)
        assert (body["id"], body["object"], body["created"], body["model"]) == ("cmpl-1", "text_completion", 9, "m")
        assert set(body) == {"id", "object", "created", "model", "choices", "usage"}


def test_chunks_escape_ids_and_model_names() -> None:
    encoder = CompletionChunkEncoder(completion_id='cmpl-"x"', model="org/mödel\\1", created=1)
    body = strict_loads(encoder.text(0, ""))
    assert (body["id"], body["model"]) == ('cmpl-"x"', "org/mödel\\1")
    assert "usage" not in body
