"""Admission control and degradation through the real HTTP server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from middleware.admission.degradation import DegradationConfig, TierLevels
from tests.live_server import MODEL_NAME, LiveServer, running_server
from tests.openai_wire import assert_openai

USER = [{"role": "user", "content": "Tell me about the sea."}]
LONG = {"model": MODEL_NAME, "messages": USER, "max_tokens": 2000, "ignore_eos": True, "stream": True}


# The degradable server's keys: a VIP tier above the shedding cut, a key allowed to run ahead
# within its tier, and a plain one (tier 0: shed at level 4).
VIP, OPS, PLAIN = "sk-vip-tier", "sk-ops-ahead", "sk-plain-key"
KEYS = {VIP: {"tier": -1}, OPS: {"min_priority": -5}, PLAIN: None}


def chat(live: LiveServer, key: str | None = None, **body: object) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    if key is None and live.state.settings.keys is not None:
        headers = {"authorization": f"Bearer {PLAIN}"}
    return httpx.post(
        f"{live.url}/v1/chat/completions", json={"model": MODEL_NAME, "messages": USER, **body}, headers=headers
    )


def test_full_queue_gets_a_fast_503_before_any_stream(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, max_model_len=2048, max_num_seqs=1, max_queued_requests=2) as live:
        url = f"{live.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=LONG) as running:
            lines = running.iter_lines()  # keep it: a dropped iterator closes the response
            next(lines)
            with httpx.stream("POST", url, json=LONG) as queued_1, httpx.stream("POST", url, json=LONG) as queued_2:
                assert queued_1.status_code == queued_2.status_code == 200
                live_core = live.engine.core
                assert live_core.num_waiting == 2
                refused = httpx.post(url, json=LONG)
                assert refused.status_code == 503
                assert refused.headers["content-type"].startswith("application/json")
                assert int(refused.headers["retry-after"]) >= 1
                assert refused.json()["error"]["type"] == "server_error"
                client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
                with pytest.raises(openai.InternalServerError) as info:
                    client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=2)
                assert info.value.status_code == 503
        live.wait_idle()


def test_request_past_its_queue_deadline_gets_503_unrun(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, max_model_len=2048, max_num_seqs=1, max_queue_seconds=0.3) as live:
        with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=LONG) as running:
            lines = running.iter_lines()  # keep it: a dropped iterator closes the response
            next(lines)
            steps = live.engine.core.num_steps
            late = chat(live, max_tokens=3)
            assert late.status_code == 503
            assert "queue" in late.json()["error"]["message"]
            assert late.headers["retry-after"]
            # Streamed: the stream was already open, so the refusal arrives as an error event.
            with httpx.stream("POST", f"{live.url}/v1/chat/completions", json={**LONG, "max_tokens": 3}) as s:
                events = [line for line in s.iter_lines() if line.startswith("data: ")]
            errors = [json.loads(e[len("data: ") :]) for e in events if '"error"' in e]
            assert errors and events[-1] == "data: [DONE]"
            assert_openai(errors[0], "ErrorResponse")
            assert live.engine.core.num_steps > steps
        live.wait_idle()


@pytest.fixture(scope="module")
def degradable(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, list[float]]]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    settings = {"max_model_len": 512, "max_num_seqs": 4, "degrade_max_tokens": 5, "degrade_max_prompt_tokens": 40}
    with running_server(tiny_model_dir, keys_file=str(keys_file), **settings) as live:  # type: ignore[arg-type]
        # The load signal is synthetic; everything downstream of it is the real server.
        score = [0.0]
        assert live.state.admission is not None
        live.state.admission.levels = TierLevels(DegradationConfig(refresh_seconds=0.0), lambda tier: score[0])
        yield live, score


def test_level_0_has_no_header(degradable: tuple[LiveServer, list[float]]) -> None:
    live, score = degradable
    score[0] = 0.0
    response = chat(live, max_tokens=3, logprobs=True)
    assert response.status_code == 200
    assert "x-surge-degraded" not in response.headers
    assert response.json()["choices"][0]["logprobs"] is not None


def test_level_1_drops_logprobs(degradable: tuple[LiveServer, list[float]]) -> None:
    live, score = degradable
    score[0] = 1.0
    response = chat(live, max_tokens=3, logprobs=True, top_logprobs=2)
    assert response.status_code == 200
    assert response.headers["x-surge-degraded"] == "1"
    assert response.json()["choices"][0]["logprobs"] is None
    assert response.json()["usage"]["completion_tokens"] <= 3


def test_level_2_clamps_max_tokens_and_rejects_long_prompts(degradable: tuple[LiveServer, list[float]]) -> None:
    live, score = degradable
    score[0] = 2.0
    response = chat(live, max_tokens=50, ignore_eos=True)
    assert response.headers["x-surge-degraded"] == "2"
    assert response.json()["usage"]["completion_tokens"] == 5
    long_prompt = [{"role": "user", "content": "word " * 60}]
    refused = chat(live, messages=long_prompt, max_tokens=3)
    assert refused.status_code == 503 and refused.headers["retry-after"]


def test_level_3_serves_the_canned_reply_in_openai_shape(degradable: tuple[LiveServer, list[float]]) -> None:
    live, score = degradable
    score[0] = 4.0
    canned = live.state.settings.canned_reply
    steps = live.engine.core.num_steps
    response = chat(live, max_tokens=20)
    assert response.headers["x-surge-degraded"] == "3"
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == canned
    assert body["choices"][0]["finish_reason"] == "stop"
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=PLAIN, max_retries=0)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=20, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == canned
    assert live.engine.core.num_steps == steps  # the model was not used
    # A key of a tier above the shedding cut still gets a real generation; a key allowed to run
    # ahead within tier 0 does not escape it.
    vip = chat(live, VIP, max_tokens=3)
    assert vip.json()["choices"][0]["message"]["content"] != canned
    ahead = chat(live, OPS, max_tokens=3, priority=-5)
    assert ahead.json()["choices"][0]["message"]["content"] == canned


def test_level_3_never_hands_the_canned_text_to_a_format_request(degradable: tuple[LiveServer, list[float]]) -> None:
    live, score = degradable
    schema = {"type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"], "additionalProperties": False}
    formatted = {
        "max_tokens": 5,  # within level 2's clamp, so the level-3 request has the same fingerprint
        "seed": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }
    score[0] = 0.0
    assert live.state.admission is not None  # fresh levels: no hysteresis from earlier tests
    live.state.admission.levels = TierLevels(DegradationConfig(refresh_seconds=0.0), lambda tier: score[0])
    generated = chat(live, **formatted)  # a seeded reply the dedup cache keeps
    assert generated.status_code == 200
    score[0] = 4.0
    steps = live.engine.core.num_steps
    cached = chat(live, **formatted)
    assert cached.headers["x-surge-degraded"] == "3"
    assert cached.json()["choices"][0]["message"]["content"] == generated.json()["choices"][0]["message"]["content"]
    for response_format in ({"type": "json_object"}, formatted["response_format"]):
        refused = chat(live, max_tokens=20, response_format=response_format)  # unseeded: nothing cached
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert refused.json()["error"]["code"] == "service_unavailable"
    assert live.engine.core.num_steps == steps
    # Plain text still gets the canned reply.
    assert chat(live, max_tokens=20).json()["choices"][0]["message"]["content"] == live.state.settings.canned_reply


def test_level_4_sheds_low_priority_first(degradable: tuple[LiveServer, list[float]]) -> None:
    live, score = degradable
    score[0] = 8.0
    shed = chat(live, max_tokens=3)
    assert shed.status_code == 503 and int(shed.headers["retry-after"]) >= 1
    assert json.loads(shed.content)["error"]["message"]
    vip = chat(live, VIP, max_tokens=3)
    assert vip.status_code == 200
    assert vip.headers["x-surge-degraded"] == "4"
    assert chat(live, OPS, max_tokens=3, priority=-5).status_code == 503  # its tier is shed
    score[0] = 0.0


@pytest.mark.parametrize("priority", [-1, -(10**6), -(10**30)])
def test_a_negative_priority_cannot_escape_shedding(degradable: tuple[LiveServer, list[float]], priority: int) -> None:
    """The attack: `"priority": -1` (or far below) used to outrank every tier and escape levels 3-4."""
    live, score = degradable
    score[0] = 8.0
    try:
        refused = chat(live, max_tokens=3, priority=priority)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "priority" and error["type"] == "invalid_request_error"
        # A key allowed to go below 0 is still bounded by its own floor.
        assert chat(live, OPS, max_tokens=3, priority=-6).status_code == 400
        stream = httpx.post(
            f"{live.url}/v1/chat/completions",
            json={"model": MODEL_NAME, "messages": USER, "max_tokens": 3, "stream": True, "priority": priority},
            headers={"authorization": f"Bearer {PLAIN}"},
        )
        assert stream.status_code == 400 and stream.headers["content-type"].startswith("application/json")
    finally:
        score[0] = 0.0


def test_a_positive_priority_only_lowers_its_own_place(degradable: tuple[LiveServer, list[float]]) -> None:
    live, score = degradable
    score[0] = 8.0
    try:
        assert chat(live, VIP, max_tokens=3, priority=1000).status_code == 200  # still the VIP tier
        assert chat(live, max_tokens=3, priority=10**6 + 1).status_code == 400  # bounded
    finally:
        score[0] = 0.0


def test_canned_replies_are_not_stored_for_an_idempotency_key(degradable: tuple[LiveServer, list[float]]) -> None:
    live, score = degradable
    headers = {"Idempotency-Key": "canned-then-real", "authorization": f"Bearer {PLAIN}"}
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 3}
    score[0] = 4.0
    assert live.state.admission is not None  # fresh levels: no hysteresis from earlier tests
    live.state.admission.levels = TierLevels(DegradationConfig(refresh_seconds=0.0), lambda tier: score[0])
    canned = httpx.post(f"{live.url}/v1/chat/completions", json=body, headers=headers)
    assert canned.headers["x-surge-degraded"] == "3"
    score[0] = 0.0
    assert live.state.admission is not None  # fresh levels: no hysteresis from level 3
    live.state.admission.levels = TierLevels(DegradationConfig(refresh_seconds=0.0), lambda tier: score[0])
    retry = httpx.post(f"{live.url}/v1/chat/completions", json=body, headers=headers)
    assert "idempotent-replayed" not in retry.headers
    assert retry.json()["choices"][0]["message"]["content"] != live.state.settings.canned_reply
