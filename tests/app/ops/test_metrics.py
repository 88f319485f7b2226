"""GET /metrics on a real server: every name, counters that move, gauges that come back to idle."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from app.config.settings import Settings
from app.ops.metrics import ServerCollector
from app.runtime.state import ServerState
from middleware.admission.degradation import DegradationConfig, TierLevels
from models.runner import gpu
from scripts.harness.ports import free_port
from tests.live_server import MODEL_NAME, LiveServer, running_server

USER = [{"role": "user", "content": "Tell me about the sea."}]
LONG = {"model": MODEL_NAME, "messages": USER, "max_tokens": 2000, "ignore_eos": True, "stream": True}
GAUGES = [
    "surge_requests_waiting",
    "surge_requests_running",
    "surge_requests_in_queue_per_worker",
    "surge_kv_cache_usage_ratio",
    "surge_max_num_seqs",
    "surge_kv_cache_budget_bytes",
    "surge_degradation_level",
    "surge_degradation_signal_ratio",
    "surge_prefix_cache_used_bytes",
    "surge_prefix_cache_capacity_bytes",
]
HISTOGRAMS = [
    "surge_time_to_first_token_seconds",
    "surge_inter_token_latency_seconds",
    "surge_e2e_request_latency_seconds",
    "surge_queue_time_seconds",
    "surge_batch_size",
    "surge_engine_step_seconds",
    "surge_grammar_mask_seconds",
    "surge_grammar_compile_seconds",
]
COUNTERS = [
    "surge_prompt_tokens_total",
    "surge_generation_tokens_total",
    "surge_requests_finished_total",
    "surge_requests_aborted_total",
    "surge_requests_preempted_total",
    "surge_rate_limited_requests_total",
    "surge_idempotent_replays_total",
    "surge_idempotency_conflicts_total",
    "surge_dedup_hits_total",
    "surge_dedup_misses_total",
    "surge_constrained_requests_total",
    "surge_auth_failures_total",
    "surge_shed_requests_total",
    "surge_redis_fallbacks_total",
    "surge_prefix_cache_queried_tokens_total",
    "surge_prefix_cache_hit_tokens_total",
    "surge_prefix_cache_evicted_blocks_total",
]
IDLE_GAUGES = GAUGES[:4]


class Scrape:
    """One /metrics answer: its text and its samples."""

    def __init__(self, live: LiveServer) -> None:
        response = live.scrape()
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        self.text = response.text
        self.samples = [sample for family in text_string_to_metric_families(self.text) for sample in family.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels` (0 when there are none)."""
        return sum(
            s.value for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def idle_levels(self) -> dict[str, float]:
        return {name: self.value(name) for name in IDLE_GAUGES}


def assert_idle(live: LiveServer, timeout: float = 5.0) -> Scrape:
    """Wait until every queue gauge is back at 0 (fails the test if never); the last scrape."""
    deadline = time.monotonic() + timeout
    while True:
        scrape = Scrape(live)
        levels = scrape.idle_levels()
        if not any(levels.values()):
            return scrape
        if time.monotonic() > deadline:
            raise AssertionError(f"gauges not idle: {levels}")
        time.sleep(0.02)


def chat(live: LiveServer, **body: object) -> httpx.Response:
    return httpx.post(f"{live.url}/v1/chat/completions", json={"model": MODEL_NAME, "messages": USER, **body})


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    settings = {"max_model_len": 2048, "max_num_seqs": 1, "max_queued_requests": 2, "rate_limit_tpm": 7000}
    with running_server(tiny_model_dir, **settings) as server:  # type: ignore[arg-type]
        yield server


def test_every_metric_has_help_and_the_model_label(live: LiveServer) -> None:
    assert chat(live, max_tokens=3).status_code == 200
    scrape = assert_idle(live)
    for name in GAUGES + COUNTERS + HISTOGRAMS:
        assert f"# HELP {name} " in scrape.text, name
        sample_name = name if name not in HISTOGRAMS else f"{name}_count"
        models = {s.labels.get("model") for s in scrape.samples if s.name == sample_name}
        assert models == {MODEL_NAME}, name
    # HTTP metrics from the instrumentator, by handler and exact status; scrapes are not counted.
    assert scrape.value("http_requests_total", handler="/v1/chat/completions", status="200") >= 1
    assert scrape.value("http_request_duration_seconds_count", handler="/v1/chat/completions") >= 1
    assert scrape.value("http_requests_total", handler="/metrics") == 0
    # The deployment's model version, for a canary's comparison: --revision's, or `unversioned`.
    (info,) = [s for s in scrape.samples if s.name == "surge_model_info"]
    assert info.value == 1 and info.labels == {"model": MODEL_NAME, "model_version": "unversioned"}


def test_401s_are_counted(tiny_model_dir: Path) -> None:
    settings = {"api_key": ("k",), "metrics_key": "mk-scraper"}  # with API keys set, /metrics needs its key
    with running_server(tiny_model_dir, max_model_len=256, max_num_seqs=1, **settings) as server:
        assert httpx.post(f"{server.url}/v1/chat/completions", json={}).status_code == 401
        scrape = Scrape(server)
        assert scrape.value("http_requests_total", handler="/v1/chat/completions", status="401") == 1


def test_token_and_finish_counters_follow_requests(live: LiveServer) -> None:
    before = assert_idle(live)
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=USER, max_tokens=5, temperature=1.0, extra_body={"ignore_eos": True}
    )
    assert reply.usage is not None and reply.choices[0].finish_reason == "length"
    after = assert_idle(live)

    def delta(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    # Prefilled tokens: what the prefix cache held (an earlier test sent this prompt) is not computed.
    assert reply.usage.prompt_tokens_details is not None
    cached = reply.usage.prompt_tokens_details.cached_tokens or 0
    assert delta("surge_prompt_tokens_total") == reply.usage.prompt_tokens - cached
    assert delta("surge_prefix_cache_hit_tokens_total") == cached
    assert delta("surge_generation_tokens_total") == 5
    assert delta("surge_requests_finished_total", finish_reason="length") == 1
    assert delta("surge_requests_finished_total", finish_reason="stop") == 0
    assert delta("surge_time_to_first_token_seconds_count") == 1
    assert delta("surge_inter_token_latency_seconds_count") == 4
    assert delta("surge_e2e_request_latency_seconds_count") == 1
    assert delta("surge_queue_time_seconds_count") == 1
    assert delta("surge_batch_size_count") >= 5
    assert delta("surge_engine_step_seconds_count") == delta("surge_batch_size_count")  # one per step
    assert delta("surge_engine_step_seconds_sum") > 0


def test_constrained_requests_compile_once_and_mask_every_step(live: LiveServer) -> None:
    before = assert_idle(live)
    schema = {"type": "object", "properties": {"q": {"enum": [1, 2]}}, "required": ["q"], "additionalProperties": False}
    formatted = {"type": "json_schema", "json_schema": {"name": "q", "schema": schema}}
    replies = [chat(live, max_tokens=30, seed=seed, response_format=formatted).json() for seed in range(2)]
    assert chat(live, max_tokens=30, response_format={"type": "json_object"}).status_code == 200
    assert chat(live, max_tokens=3).status_code == 200  # free text: no mask, no count
    after = assert_idle(live)

    def delta(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert delta("surge_constrained_requests_total", kind="json_schema") == 2
    assert delta("surge_constrained_requests_total", kind="json_object") == 1
    assert delta("surge_grammar_compile_seconds_count") == 2  # the schema once, JSON mode once
    # One step with masks per constrained token; the free request's steps ran alone (max_num_seqs 1).
    constrained_tokens = sum(reply["usage"]["completion_tokens"] for reply in replies)
    assert delta("surge_grammar_mask_seconds_count") >= constrained_tokens
    assert delta("surge_grammar_mask_seconds_count") < delta("surge_batch_size_count")


def test_gauges_return_to_idle_after_a_forward_failure(live: LiveServer) -> None:
    before = assert_idle(live)
    core = live.engine.core

    def failing(*args: object) -> None:
        del core._execute  # type: ignore[method-assign]  # fail one step, then the real method again
        raise RuntimeError("injected forward failure")

    core._execute = failing  # type: ignore[method-assign]
    assert chat(live, max_tokens=3).status_code == 500
    after = assert_idle(live)
    assert after.value("surge_requests_finished_total", finish_reason="error") == (
        before.value("surge_requests_finished_total", finish_reason="error") + 1
    )
    assert chat(live, max_tokens=3).status_code == 200  # the loop lived on


def test_gauges_return_to_idle_after_a_client_abort_mid_stream(live: LiveServer) -> None:
    before = assert_idle(live)
    with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=LONG) as response:
        lines = response.iter_lines()
        for _ in range(6):  # events arrive while generating: the metrics middleware does not buffer
            next(lines)
        busy = Scrape(live)
        assert busy.value("surge_requests_running") == 1
        assert busy.value("surge_kv_cache_usage_ratio") > 0
    after = assert_idle(live)
    assert after.value("surge_requests_aborted_total") == before.value("surge_requests_aborted_total") + 1
    assert after.value("http_requests_total", handler="/v1/chat/completions", status="200") > before.value(
        "http_requests_total", handler="/v1/chat/completions", status="200"
    )


def test_gauges_return_to_idle_after_a_disconnect_of_a_non_streamed_request(live: LiveServer) -> None:
    before = assert_idle(live)

    def post() -> None:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(
                f"{live.url}/v1/chat/completions",
                json={"model": MODEL_NAME, "messages": USER, "max_tokens": 1500, "ignore_eos": True},
                timeout=0.3,
            )

    thread = threading.Thread(target=post)
    thread.start()
    thread.join()
    after = assert_idle(live)
    assert after.value("surge_requests_aborted_total") == before.value("surge_requests_aborted_total") + 1


def test_gauges_count_the_queue_and_return_to_idle_after_queue_full_503(live: LiveServer) -> None:
    before = assert_idle(live)
    url = f"{live.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=LONG) as running:
        lines = running.iter_lines()  # keep it: a dropped iterator closes the response
        next(lines)
        with httpx.stream("POST", url, json=LONG) as queued_1, httpx.stream("POST", url, json=LONG) as queued_2:
            assert queued_1.status_code == queued_2.status_code == 200
            busy = Scrape(live)
            assert busy.value("surge_requests_waiting") == 2
            assert busy.value("surge_requests_in_queue_per_worker") == 2
            assert busy.value("surge_requests_running") == 1
            assert httpx.post(url, json=LONG).status_code == 503
    after = assert_idle(live)
    assert after.value("surge_shed_requests_total", reason="queue_full") == (
        before.value("surge_shed_requests_total", reason="queue_full") + 1
    )
    assert after.value("surge_requests_aborted_total") == before.value("surge_requests_aborted_total") + 3


def test_gauges_return_to_idle_after_shedding_and_show_the_level(live: LiveServer) -> None:
    admission = live.state.admission
    assert admission is not None
    original = admission.levels
    admission.levels = TierLevels(DegradationConfig(refresh_seconds=0.0), lambda tier: 100.0)
    try:
        before = Scrape(live)
        assert before.value("surge_degradation_level", tier="0") == 4
        assert chat(live, max_tokens=3).status_code == 503
        after = Scrape(live)
        assert after.value("surge_shed_requests_total", reason="load") == (
            before.value("surge_shed_requests_total", reason="load") + 1
        )
    finally:
        admission.levels = original
    assert_idle(live)


def test_traffic_layer_counters(live: LiveServer) -> None:
    before = assert_idle(live)
    # The tokens bucket: a request that can never fit (cost > tokens per minute) is a 429.
    assert chat(live, max_tokens=2000, n=4).status_code == 429
    # Dedup: the same greedy request twice runs the engine once.
    assert chat(live, max_tokens=3, temperature=0).status_code == 200
    assert chat(live, max_tokens=3, temperature=0).status_code == 200
    # Idempotency: a replay, then the key reused with another body.
    headers = {"Idempotency-Key": "metrics-1"}
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 2}
    url = f"{live.url}/v1/chat/completions"
    assert httpx.post(url, json=body, headers=headers).status_code == 200
    assert httpx.post(url, json=body, headers=headers).headers["idempotent-replayed"] == "true"
    assert httpx.post(url, json={**body, "max_tokens": 3}, headers=headers).status_code == 422
    after = assert_idle(live)

    def delta(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert delta("surge_rate_limited_requests_total", bucket="tokens") == 1
    assert delta("surge_rate_limited_requests_total", bucket="requests") == 0
    assert delta("surge_dedup_misses_total") == 1
    assert delta("surge_dedup_hits_total") == 1
    assert delta("surge_idempotent_replays_total") == 1
    assert delta("surge_idempotency_conflicts_total") == 1
    assert after.value("surge_redis_fallbacks_total") == 0


def test_gauges_return_to_idle_after_a_queue_deadline_rejection(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, max_model_len=2048, max_num_seqs=1, max_queue_seconds=0.3) as server:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=LONG) as running:
            lines = running.iter_lines()
            next(lines)
            assert chat(server, max_tokens=3).status_code == 503
        after = assert_idle(server)
        assert after.value("surge_requests_finished_total", finish_reason="rejected") == 1


def test_gpu_metrics_by_device_where_cuda_is_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here: torch.cuda's answers are faked; the collector's families and labels are real.
    for name, value in [("is_available", True), ("is_initialized", True), ("device_count", 2)]:
        monkeypatch.setattr(torch.cuda, name, lambda value=value: value)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (1_000, 5_000 + index))
    monkeypatch.setattr(torch.cuda, "utilization", lambda index: 40)
    monkeypatch.setattr(gpu, "_HAS_NVML", True)
    collector = ServerCollector(ServerState(Settings(model="tiny", served_model_name=MODEL_NAME)))
    samples = {(s.name, s.labels["device"]): s for m in collector.collect() for s in m.samples if "device" in s.labels}
    assert samples[("surge_gpu_memory_used_bytes", "cuda:1")].value == 4_001
    assert samples[("surge_gpu_utilization_ratio", "cuda:0")].value == 0.4
    assert samples[("surge_gpu_utilization_ratio", "cuda:0")].labels["model"] == MODEL_NAME
    monkeypatch.setattr(gpu, "_HAS_NVML", False)
    names = {m.name for m in collector.collect()}
    assert "surge_gpu_memory_used_bytes" in names and "surge_gpu_utilization_ratio" not in names


def test_metrics_need_the_metrics_key_when_one_is_set(tiny_model_dir: Path) -> None:
    """The attack surface: /metrics on the API port told anyone who could reach it how much each
    part of the service was used (rates, errors, queue depths). With --metrics-key it is for
    Prometheus only; /health and /ready stay open for the kubelet."""
    with running_server(tiny_model_dir, max_model_len=256, metrics_key="mk-scraper") as live:
        url = f"{live.url}/metrics"
        assert httpx.get(url).status_code == 401
        wrong = httpx.get(url, headers={"authorization": "Bearer mk-guess"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        scraped = httpx.get(url, headers={"authorization": "Bearer mk-scraper"})
        assert scraped.status_code == 200 and "surge_requests_waiting" in scraped.text
        assert httpx.get(f"{live.url}/health").status_code == 200
        assert httpx.get(f"{live.url}/ready").status_code == 200


def test_guessing_the_metrics_key_gets_429s_while_prometheus_keeps_scraping(tiny_model_dir: Path) -> None:
    """The attack: the API keys' 401s were throttled per address, the metrics key's were not, so
    a tenant could try metrics keys on the API port as fast as the network allowed."""
    settings = {"api_key": ("sk-tenant",), "metrics_key": "mk-scraper", "auth_failures_per_minute": 3}
    with running_server(tiny_model_dir, max_model_len=256, **settings) as live:
        url = f"{live.url}/metrics"
        guesses = [httpx.get(url, headers={"authorization": f"Bearer mk-{i}"}) for i in range(5)]
        assert [reply.status_code for reply in guesses] == [401] * 3 + [429] * 2
        assert int(guesses[-1].headers["retry-after"]) >= 1
        assert live.scrape().status_code == 200  # the right key is never throttled
        assert Scrape(live).value("surge_auth_failures_total", outcome="throttled") == 2


def test_a_tenant_cannot_read_every_tenants_traffic_from_metrics(tiny_model_dir: Path) -> None:
    """The attack: with API keys set, /metrics on the API port stayed open unless --metrics-key was
    given: any tenant (or anyone) read every tenant's rates, latencies and errors, and from the
    grammar compile histogram that another key had just compiled a schema. Now, with keys and no
    metrics key, the API port refuses it (403, naming the two ways to open it), valid API keys
    included; /health and /ready stay open for the kubelet."""
    with running_server(tiny_model_dir, max_model_len=256, api_key=("sk-tenant",)) as live:
        url = f"{live.url}/metrics"
        for headers in ({}, {"authorization": "Bearer sk-tenant"}):
            refused = httpx.get(url, headers=headers)
            assert refused.status_code == 403, refused.text
            error = refused.json()["error"]
            assert error["code"] == "metrics_closed"
            assert "--metrics-key" in error["message"] and "--metrics-port" in error["message"]
            assert "surge_grammar_compile_seconds" not in refused.text
        assert httpx.get(f"{live.url}/health").status_code == 200
        assert httpx.get(f"{live.url}/ready").status_code == 200
    # Auth off (one user, on a laptop): open, as before.
    with running_server(tiny_model_dir, max_model_len=256) as live:
        assert "surge_requests_waiting" in httpx.get(f"{live.url}/metrics").text


def test_metrics_leave_the_api_port_for_a_port_of_their_own(tiny_model_dir: Path) -> None:
    """`--metrics-port`: /metrics, /health and /ready on a second listener of the same process (the
    same registry: the API port's traffic shows there); the API port has no /metrics at all."""
    port = free_port()
    settings = {"api_key": ("sk-tenant",), "metrics_port": port}
    with running_server(tiny_model_dir, max_model_len=256, **settings) as live:
        tenant = {"authorization": "Bearer sk-tenant"}
        assert httpx.get(f"{live.url}/metrics", headers=tenant).status_code == 404
        assert chat(live, max_tokens=2).status_code == 401
        reply = httpx.post(
            f"{live.url}/v1/chat/completions",
            json={"model": MODEL_NAME, "messages": USER, "max_tokens": 2},
            headers=tenant,
        )
        assert reply.status_code == 200
        metrics = f"http://127.0.0.1:{port}"
        scrape = Scrape(live)  # on the metrics port, with no key
        assert scrape.value("http_requests_total", handler="/v1/chat/completions", status="200") == 1
        assert scrape.value("http_requests_total", handler="/v1/chat/completions", status="401") == 1
        assert scrape.value("surge_generation_tokens_total") >= 1
        assert httpx.get(f"{metrics}/health").json() == {"status": "ok"}
        assert httpx.get(f"{metrics}/ready").status_code == 200
        assert httpx.post(f"{metrics}/v1/chat/completions", json={}).status_code == 404  # no API there
    # A metrics key applies on the metrics port too.
    with running_server(tiny_model_dir, max_model_len=256, metrics_port=port, metrics_key="mk-scraper") as live:
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 401
        assert live.scrape().status_code == 200


def test_the_metrics_port_must_differ_from_the_api_port() -> None:
    with pytest.raises(ValueError, match="metrics_port"):
        Settings(port=8000, metrics_port=8000)
    with pytest.raises(ValueError, match="metrics_port"):
        Settings(metrics_port=70000)
