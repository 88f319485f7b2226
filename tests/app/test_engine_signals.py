"""The engine's own degradation triggers, each driven through a real server: its step time, its
KV pool, the memory and the CPU in use. Each test lowers one trigger's bound so that the tiny model
crosses it, turns the others off, and sees the signal in /metrics, the level rise, and a request
served degraded (level 1: no logprobs, the `x-surge-degraded` header).

The thresholds put every score from 1 up to a million at level 1, so the crossing is the only
thing that decides the level, whatever the machine's speed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import MODEL_NAME, LiveServer, running_server

LEVEL_ONE_ONLY = "1,1000000,2000000,3000000"
ONLY = {"degrade_step_seconds": 0.0, "degrade_kv_usage": 0.0, "degrade_memory_usage": 0.0, "degrade_compute_usage": 0.0}
# The step-time bound alone: not also a multiple of the tiny model's own full-load step.
FIXED_STEP = {"degrade_step_seconds": 1e-6, "degrade_full_step_factor": 0.0}


@pytest.fixture
def server_with(tiny_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    bounds, engine_mode = request.param
    settings = {**ONLY, **bounds, "degrade_thresholds": LEVEL_ONE_ONLY, "engine_mode": engine_mode}
    with running_server(tiny_model_dir, max_model_len=512, max_num_seqs=2, **settings) as server:
        yield server


def scrape(server: LiveServer) -> tuple[dict[str, float], int]:
    """(each signal's ratio, tier 0's level) from /metrics."""
    signals, level = {}, -1
    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "surge_degradation_signal_ratio":
                signals[sample.labels["signal"]] = sample.value
            elif sample.name == "surge_degradation_level" and sample.labels["tier"] == "0":
                level = int(sample.value)
    return signals, level


def scrape_until(server: LiveServer, signal: str, seconds: float = 10.0) -> tuple[dict[str, float], int]:
    """`scrape` until `signal` is over its bound and the level is 1, or `seconds` pass (the last
    scrape either way). The figures lag the replies: the load window is recomputed at most every
    0.1 s, and an engine in its own process sends its step times after the tokens."""
    deadline = time.monotonic() + seconds
    while True:
        signals, level = scrape(server)
        if (signals[signal] > 1.0 and level == 1) or time.monotonic() > deadline:
            return signals, level
        time.sleep(0.05)


def chat_with_logprobs(server: LiveServer) -> httpx.Response:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    body |= {"logprobs": True, "top_logprobs": 2}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply


def assert_served_degraded(server: LiveServer) -> None:
    reply = chat_with_logprobs(server)
    assert reply.headers.get("x-surge-degraded") == "1"
    assert reply.json()["choices"][0]["logprobs"] is None


def generate(server: LiveServer, max_tokens: int) -> None:
    body = {"model": MODEL_NAME, "prompt": "count", "max_tokens": max_tokens, "ignore_eos": True}
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).status_code == 200


@pytest.mark.parametrize(
    "server_with",
    [(FIXED_STEP, "thread"), (FIXED_STEP, "process")],
    indirect=True,
)
def test_slow_engine_steps_degrade(server_with: LiveServer) -> None:
    """In both engine modes (on a thread its observer records the steps, in its own process they
    come back as events): a few steps are no signal, a window of them is."""
    server = server_with
    reply = chat_with_logprobs(server)  # two steps: fewer than a window needs
    assert reply.headers.get("x-surge-degraded") is None and reply.json()["choices"][0]["logprobs"]
    signals, level = scrape(server)
    assert signals["step_time"] == 0.0 and level == 0
    generate(server, 32)
    signals, level = scrape_until(server, "step_time")
    assert signals["step_time"] > 1.0 and level == 1, signals
    assert all(value == 0.0 for name, value in signals.items() if name not in ("step_time", "ttft", "queue_time"))
    assert_served_degraded(server)


@pytest.mark.parametrize("server_with", [({"degrade_kv_usage": 0.01}, "thread")], indirect=True)
def test_a_full_kv_pool_degrades_while_it_is_held(server_with: LiveServer) -> None:
    """2 slots x 512 tokens: the 20 tokens read (40 lines) hold 2% of the pool, twice the bound."""
    server = server_with
    signals, level = scrape(server)
    assert signals["kv_usage"] == 0.0 and level == 0
    body = {"model": MODEL_NAME, "prompt": "count", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        for _ in range(40):
            next(lines)
        signals, level = scrape(server)
        assert signals["kv_usage"] > 1.0 and level == 1, signals
        assert_served_degraded(server)
        for _ in lines:
            pass
    assert scrape(server)[0]["kv_usage"] == 0.0  # released with the sequence (the level cools down)


@pytest.mark.parametrize("server_with", [({"degrade_memory_usage": 1e-4}, "thread")], indirect=True)
def test_memory_in_use_over_its_bound_degrades(server_with: LiveServer) -> None:
    server = server_with
    signals, level = scrape(server)
    assert signals["memory"] > 1.0 and level == 1, signals
    assert_served_degraded(server)


@pytest.mark.parametrize("server_with", [({"degrade_compute_usage": 1e-4}, "thread")], indirect=True)
def test_a_busy_cpu_over_its_bound_degrades(server_with: LiveServer) -> None:
    """The CPU share needs two readings a second apart; generating between them keeps it busy."""
    server = server_with
    assert scrape(server)[0]["compute"] == 0.0  # the first reading: nothing to compare with
    worker = threading.Thread(target=generate, args=(server, 64))
    worker.start()
    time.sleep(1.2)
    worker.join(timeout=60)
    signals, level = scrape_until(server, "compute", seconds=0.5)
    assert signals["compute"] > 1.0 and level == 1, signals
    assert_served_degraded(server)
