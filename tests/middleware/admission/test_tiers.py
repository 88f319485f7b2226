"""Degradation per tier, through a real server with a keys file of three tiers and the real load
signal: a tier is degraded by its own load and the more important tiers', never a lower tier's,
and one request is one sample however many sequences it has (issue 34)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from models.engine.faults import ForwardFaults
from tests.live_server import MODEL_NAME, LiveServer, running_server

TIER_0, TIER_1, TIER_2 = "sk-tier-0", "sk-tier-1", "sk-tier-2"
KEYS = {TIER_0: {"tier": 0}, TIER_1: {"tier": 1}, TIER_2: {"tier": 2}}
USER = [{"role": "user", "content": "Tell me about the sea."}]


METRICS_KEY = "prometheus"


def headers(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def chat(live: LiveServer, key: str, **body: object) -> httpx.Response:
    return httpx.post(
        f"{live.url}/v1/chat/completions",
        json={"model": MODEL_NAME, "messages": USER, **body},
        headers=headers(key),
        timeout=60,
    )


def failed_sequences(live: LiveServer) -> float:
    """Sequences that ended with an error so far (the metric counts sequences)."""
    text = httpx.get(f"{live.url}/metrics", headers=headers(METRICS_KEY)).text
    families = text_string_to_metric_families(text)
    return sum(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == "surge_requests_finished_total" and sample.labels.get("finish_reason") == "error"
    )


def wait_until(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    # The real load signal at its defaults, but a queue depth of 16 (a fan-out's 240 waiting
    # sequences are then a score of 15: level 4 for whoever they count for). No per-key share of the
    # queue: its 429 would answer tier 2 before its level does (that share is test_burst.py's).
    settings = {"max_model_len": 512, "max_num_seqs": 16, "degrade_queue_depth": 16, "max_queue_share_per_key": 1.0}
    settings["metrics_key"] = METRICS_KEY  # /metrics is closed on the API port while keys are set
    with running_server(tiny_model_dir, keys_file=str(keys_file), **settings) as server:  # type: ignore[arg-type]
        yield server


def test_a_low_tiers_fan_out_request_does_not_degrade_tier_0(live: LiveServer) -> None:
    """The attack: one tier-2 /v1/completions request of 16 prompts x n 16 (256 sequences, inside
    every cap) drove the one server-wide level to 4: tier-0 requests lost logprobs and were clamped
    or shed. Now its load is tier 2's: tier 2 is degraded (shed, here), tiers 0 and 1 are not."""
    admission = live.state.admission
    assert admission is not None
    assert admission.levels.levels() == {0: 0, 1: 0, 2: 0}
    fan_out = {
        "model": MODEL_NAME,
        "prompt": [f"prompt {i}" for i in range(16)],
        "n": 16,
        "max_tokens": 16,
        "ignore_eos": True,
        "stream": True,
    }
    core = live.engine.core
    url = f"{live.url}/v1/completions"
    with httpx.stream("POST", url, json=fan_out, headers=headers(TIER_2), timeout=60) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()  # kept: a dropped iterator closes the response
        next(lines)
        wait_until(lambda: core.num_waiting >= 200)
        wait_until(lambda: admission.levels.level(2) == 4)  # tier 2's own surge degrades tier 2
        shed = chat(live, TIER_2, max_tokens=3)
        assert shed.status_code == 503 and shed.headers["retry-after"]
        for key in (TIER_0, TIER_1):
            served = chat(live, key, max_tokens=3, logprobs=True, top_logprobs=2)
            assert served.status_code == 200, served.text
            assert "x-surge-degraded" not in served.headers
            assert served.json()["choices"][0]["logprobs"] is not None
        assert admission.levels.level(0) == admission.levels.level(1) == 0
        assert core.num_waiting >= 100  # all of this while the fan-out was still queued
    live.wait_idle()
    assert admission.levels.level(0) == 0


def test_failed_sequences_of_one_request_are_one_error_sample(live: LiveServer) -> None:
    """The attack (finding 2): every sequence of a request with n 16 that the server failed counted
    as an error, so two such requests could be 32 errors, an error rate of 1.0 past the 20-finish
    floor, and level 3 (canned replies) for every tenant for the whole window. One request is one
    sample: a few failed requests are a few, under the floor. (The same path keeps a request whose own input
    made it fail, such as a grammar that rejects every token, out of the error rate: only the
    server's errors count.)"""
    admission = live.state.admission
    assert admission is not None
    core = live.engine.core
    core._faults = ForwardFaults(frozenset(range(1, 1000)))  # the engine is on a thread here: every pass fails
    num_requests = 0
    try:
        # Until the failed sequences are past the error rate's floor of 20 finishes (a request's
        # route stops at its first failed sequence and aborts the rest, so each fails a few to 16).
        while failed_sequences(live) < 24:
            failed = chat(live, TIER_0, max_tokens=2, n=16)
            assert failed.status_code == 500, failed.text
            num_requests += 1
    finally:
        core._faults = None
    assert num_requests < 20
    live.wait_idle()
    assert live.engine.load_snapshot(0).error_rate == 0.0
    assert admission.levels.level(0) == 0
    served = chat(live, TIER_0, max_tokens=3)
    assert served.status_code == 200
    assert "x-surge-degraded" not in served.headers
    assert served.json()["choices"][0]["message"]["content"] != live.state.settings.canned_reply
