"""Several chat models in one server (`--model` repeated): each its own engine, picked by the
request's `model`, listed by /v1/models, named in replies and in the metrics' `model` label."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from app.config.arguments import parse_settings
from app.config.settings import Settings
from models.loading.loader import resolve_model_path
from models.loading.tiny import build_tiny
from tests.live_server import MODEL_NAME, LiveServer, running_server

OTHER = "tiny-qwen"


@pytest.fixture(scope="module")
def other_dir(model_root: Path) -> Path:
    """A second model, another architecture (so its text differs), the same tokenizer."""
    return build_tiny("s", model_root / "served-qwen2-s", arch="qwen2")


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, other_dir: Path) -> Iterator[LiveServer]:
    models = (f"{OTHER}={other_dir}",)
    settings = {"max_model_len": 256, "max_num_seqs": 4, "embedding_model": "tiny", "model_version": "7"}
    with running_server(tiny_model_dir, models=models, **settings) as live:
        yield live


def test_the_request_picks_its_model_and_the_reply_names_it(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert [model.id for model in client.models.list().data] == [MODEL_NAME, OTHER, "tiny-embedding"]
    card = client.models.retrieve(OTHER)
    assert card.id == OTHER and card.model_extra is not None and card.model_extra["root"] == OTHER
    main, other = server.state.models[MODEL_NAME].engine, server.state.models[OTHER].engine
    assert main is server.engine and other is not main
    messages = [{"role": "user", "content": "Say something"}]
    replies = {}
    for name, engine, idle in ((MODEL_NAME, main, other), (OTHER, other, main)):
        steps, idle_steps = engine.core.num_steps, idle.core.num_steps
        raw = client.chat.completions.with_raw_response.create(
            model=name,
            messages=messages,
            max_tokens=8,
            temperature=0,  # type: ignore[arg-type]
        )
        assert raw.headers["x-surge-model"] == name
        reply = raw.parse()
        assert reply.model == name
        replies[name] = reply.choices[0].message.content
        assert engine.core.num_steps > steps and idle.core.num_steps == idle_steps  # its own engine ran it
    assert replies[MODEL_NAME] != replies[OTHER]  # two models, two greedy texts
    # Every protocol routes by `model`.
    completion = client.completions.create(model=OTHER, prompt="Hello", max_tokens=4)
    assert completion.model == OTHER
    response = client.responses.create(model=OTHER, input="Hello", max_output_tokens=4)
    assert response.model == OTHER
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=messages)  # type: ignore[arg-type]
    # /tokenize counts with the named model's tokenizer.
    counted = httpx.post(f"{server.url}/tokenize", json={"model": OTHER, "prompt": "Hello there"}).json()
    assert counted["count"] > 0


def test_metrics_carry_each_models_label(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model=OTHER, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    text = server.scrape().text
    for name in (MODEL_NAME, OTHER):
        assert f'surge_requests_running{{model="{name}"}}' in text
        assert f'surge_time_to_first_token_seconds_count{{model="{name}"}}' in text
        assert f'model_name="{name}"' in text  # vLLM's names, as routers read them
    # The deployment's version on each: one per pod, as the canary's rules join it (k8s/prometheus).
    assert f'surge_model_info{{model="{OTHER}",model_version="7"}} 1.0' in text
    assert f'surge_model_info{{model="{MODEL_NAME}",model_version="7"}} 1.0' in text


def test_one_engine_dead_is_the_server_unhealthy(server: LiveServer) -> None:
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/ready").status_code == 200


@pytest.mark.parametrize(
    ("argv", "models"),
    [
        (["--model", "tiny"], ()),
        (
            ["--model", "tiny", "--model", "light=tiny:s", "--model", "third=/models/x"],
            ("light=tiny:s", "third=/models/x"),
        ),
    ],
)
def test_model_repeats_on_the_command_line(argv: list[str], models: tuple[str, ...]) -> None:
    settings = parse_settings(argv, environ={})
    assert settings.model == "tiny" and settings.models == models
    assert settings.chat_models[0] == ("tiny", "tiny")
    assert parse_settings([], environ={"SURGE_MODEL": "tiny,light=tiny:s"}).models == ("light=tiny:s",)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"models": ("no-name",)}, "NAME=MODEL"),
        ({"models": ("=tiny:s",)}, "NAME=MODEL"),
        ({"models": ("tiny=tiny:s",)}, "a name of its own"),
        ({"models": ("tiny-embedding=tiny:s",)}, "a name of its own"),
        ({"models": ("a=tiny:s",), "light_model": "b"}, "light_model must name"),
        ({"models": ("a=tiny:s",), "light_model": "a", "light_model_level": 5}, "light_model_level"),
    ],
)
def test_bad_model_lists_stop_the_start(values: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Settings(**values)  # type: ignore[arg-type]


def test_tiny_sizes_resolve_offline() -> None:
    config = json.loads((Path(resolve_model_path("tiny:s")) / "config.json").read_text())
    assert config["hidden_size"] == 128
