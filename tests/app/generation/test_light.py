"""The light model as a degradation level, through a real server with two models: under load
(the main model's level for the tier at --light-model-level), simple requests go to the light
model and say so; others stay, and the light model's own load keeps them off it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from middleware.admission.degradation import DegradationConfig, TierLevels
from models.loading.tiny import build_tiny
from tests.live_server import MODEL_NAME, LiveServer, running_server

LIGHT = "tiny-light"
KEYS = {"sk-paid": {"tier": 0}, "sk-free": {"tier": 1}}


@pytest.fixture(scope="module")
def light_dir(model_root: Path) -> Path:
    return build_tiny("s", model_root / "light-qwen2-s", arch="qwen2")


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path, light_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    with running_server(
        tiny_model_dir,
        models=(f"{LIGHT}={light_dir}",),
        light_model=LIGHT,
        light_model_level=2,
        light_model_max_prompt_tokens=64,
        light_model_max_tokens=6,
        light_model_min_tier=1,
        keys_file=str(keys),
        metrics_key="m",
        max_model_len=256,
    ) as live:
        yield live


@pytest.fixture
def load(live: LiveServer) -> Iterator[dict[str, float]]:
    """Each model's load score, set by the test; everything downstream of it is the real server."""
    scores = {MODEL_NAME: 0.0, LIGHT: 0.0}
    for name, served in live.state.models.items():
        served.admission.levels = TierLevels(DegradationConfig(refresh_seconds=0.0), lambda tier, n=name: scores[n])
    yield scores


def _chat(live: LiveServer, key: str = "sk-free", content: str = "Hi there", **extra: object) -> httpx.Response:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}
    return httpx.post(
        f"{live.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def test_under_load_a_simple_request_gets_the_light_model(live: LiveServer, load: dict[str, float]) -> None:
    calm = _chat(live, max_tokens=4)
    assert calm.headers["x-surge-model"] == MODEL_NAME and calm.json()["model"] == MODEL_NAME
    load[MODEL_NAME] = 2.0  # level 2 for every tier
    light = _chat(live, max_tokens=4)
    assert light.status_code == 200
    assert light.headers["x-surge-model"] == LIGHT and light.json()["model"] == LIGHT
    assert "x-surge-degraded" not in light.headers  # the light model is calm: nothing else degraded
    # max_tokens left out: capped at --light-model-max-tokens on the light model.
    capped = _chat(live, content="Tell me a long story")
    assert capped.headers["x-surge-model"] == LIGHT
    assert capped.json()["usage"]["completion_tokens"] <= 6
    # Streamed too, with the light model's name in every chunk.
    with httpx.stream(
        "POST",
        f"{live.url}/v1/chat/completions",
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True},
        headers={"authorization": "Bearer sk-free"},
    ) as stream:
        assert stream.headers["x-surge-model"] == LIGHT
        chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
    assert chunks and {chunk["model"] for chunk in chunks} == {LIGHT}
    metrics = httpx.get(f"{live.url}/metrics", headers={"authorization": "Bearer m"}).text
    assert f'surge_light_model_requests_total{{model="{MODEL_NAME}"}} 3.0' in metrics


def test_what_stays_on_the_asked_model(live: LiveServer, load: dict[str, float]) -> None:
    load[MODEL_NAME] = 2.0
    # Not simple: max_tokens past the light model's, or a prompt past its prompt bound.
    long_output = _chat(live, max_tokens=100)
    assert long_output.headers["x-surge-model"] == MODEL_NAME
    assert long_output.headers["x-surge-degraded"] == "2"
    long_prompt = _chat(live, content="word " * 80, max_tokens=4)
    assert long_prompt.headers["x-surge-model"] == MODEL_NAME
    # Tier 0 is below --light-model-min-tier 1: it keeps the model it paid for.
    paid = _chat(live, key="sk-paid", max_tokens=4)
    assert paid.headers["x-surge-model"] == MODEL_NAME
    # The light model as loaded as the main one: no point moving there.
    load[LIGHT] = 2.0
    both = _chat(live, max_tokens=4)
    assert both.headers["x-surge-model"] == MODEL_NAME
    # Below the level: nothing moves.
    load[MODEL_NAME], load[LIGHT] = 1.0, 0.0
    assert _chat(live, max_tokens=4).headers["x-surge-model"] == MODEL_NAME


def test_every_protocol_is_rerouted(live: LiveServer, load: dict[str, float]) -> None:
    load[MODEL_NAME] = 3.0
    headers = {"authorization": "Bearer sk-free"}
    completion = httpx.post(
        f"{live.url}/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 3}, headers=headers
    )
    assert completion.headers["x-surge-model"] == LIGHT and completion.json()["model"] == LIGHT
    response = httpx.post(
        f"{live.url}/v1/responses",
        json={"model": MODEL_NAME, "input": "Hi", "max_output_tokens": 3},
        headers=headers,
        timeout=30,
    )
    assert response.headers["x-surge-model"] == LIGHT and response.json()["model"] == LIGHT
    message = httpx.post(
        f"{live.url}/v1/messages",
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
        headers={"x-api-key": "sk-free"},
        timeout=30,
    )
    assert message.headers["x-surge-model"] == LIGHT and message.json()["model"] == LIGHT
