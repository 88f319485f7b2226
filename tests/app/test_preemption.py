"""Preemption by tier through a real server with its engine in its own process: a paid key's
request takes the one slot from a free key's stream, which then finishes whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.app.ops.test_metrics import Scrape
from tests.live_server import MODEL_NAME, LiveServer, running_server

PAID, FREE = "sk-paid", "sk-free"


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps({PAID: {"tier": 0}, FREE: {"tier": 2}}))
    settings = {"engine_mode": "process", "max_num_seqs": 1, "max_model_len": 1024, "keys_file": str(keys)}
    settings["metrics_key"] = "prometheus"
    with running_server(tiny_model_dir, degrade_thresholds="off", dedup_ttl_seconds=0, **settings) as server:  # type: ignore[arg-type]
        yield server


def test_a_better_tier_takes_the_slot_and_the_preempted_stream_finishes_whole(live: LiveServer) -> None:
    body = {"model": MODEL_NAME, "prompt": "count the waves", "max_tokens": 300, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {FREE}"}
    with httpx.stream("POST", f"{live.url}/v1/completions", json=body, headers=headers, timeout=120) as stream:
        lines = stream.iter_lines()
        for _ in range(20):  # the free stream holds the one slot
            next(lines)
        paid = httpx.post(
            f"{live.url}/v1/chat/completions",
            json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "now"}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {PAID}"},
            timeout=60,
        )
        assert paid.status_code == 200
        rest = [line for line in lines if line.startswith("data: {")]
    usage = json.loads(rest[-1][len("data: ") :])["usage"]
    assert usage["completion_tokens"] == 300  # nothing lost, nothing doubled
    assert Scrape(live).value("surge_requests_preempted_total") == 1


@pytest.fixture(scope="module")
def lanes(tiny_model_dir: Path) -> Iterator[LiveServer]:
    settings = {"engine_mode": "process", "max_num_seqs": 1, "max_model_len": 1024, "heavy_sequence_tokens": 128}
    settings["metrics_key"] = "prometheus"
    with running_server(tiny_model_dir, degrade_thresholds="off", dedup_ttl_seconds=0, **settings) as server:  # type: ignore[arg-type]
        yield server


def test_a_light_request_takes_the_slot_of_a_heavy_one_of_the_same_key(lanes: LiveServer) -> None:
    """Lanes: one slot, a 300-token stream (heavy) holding it; a 4-token request (light) runs at
    once, and the heavy stream still finishes whole."""
    body = {"model": MODEL_NAME, "prompt": "count the waves", "max_tokens": 300, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", f"{lanes.url}/v1/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        for _ in range(20):
            next(lines)
        light = httpx.post(
            f"{lanes.url}/v1/completions",
            json={"model": MODEL_NAME, "prompt": "now", "max_tokens": 4},
            timeout=60,
        )
        assert light.status_code == 200
        rest = [line for line in lines if line.startswith("data: {")]
    assert json.loads(rest[-1][len("data: ") :])["usage"]["completion_tokens"] == 300
    assert Scrape(lanes).value("surge_requests_preempted_total") == 1
