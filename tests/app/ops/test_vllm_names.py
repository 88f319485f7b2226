"""The contract with the routers: vLLM's metric names on a real server's /metrics, parsed by
`prometheus_client`'s parser as the routers' scrapers parse them: names, types, labels, ranges,
and values that follow the traffic (waiting, running and KV use while a stream runs; prefix-cache
hits after a shared prompt; the same counts as surge's own series)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.live_server import MODEL_NAME, LiveServer, running_server

SYSTEM = "You are a lighthouse keeper who answers in riddles about the tides and the wind. " * 8
TYPES = {
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
}


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=1024, max_num_seqs=4) as server:
        yield server


class Exposition:
    def __init__(self, live: LiveServer) -> None:
        response = live.scrape()
        assert response.status_code == 200
        self.families = {family.name: family for family in text_string_to_metric_families(response.text)}

    def samples(self, name: str) -> list[Sample]:
        return [sample for family in self.families.values() for sample in family.samples if sample.name == name]

    def value(self, name: str) -> float:
        (sample,) = self.samples(name)
        return sample.value


def chat(live: LiveServer, user: str, **extra: object) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
    client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4, **extra)  # type: ignore[call-overload]


def test_every_name_has_its_type_and_vllms_labels(live: LiveServer) -> None:
    chat(live, "First question?")
    scrape = Exposition(live)
    for name, kind in TYPES.items():
        family = scrape.families.get(name)
        assert family is not None, name
        assert family.type == kind and family.samples, name
        for sample in family.samples:
            assert sample.labels["model_name"] == MODEL_NAME and sample.labels["engine"] == "0", sample
            assert "model" not in sample.labels
    (info,) = scrape.samples("vllm:cache_config_info")
    assert info.value == 1.0 and info.labels["block_size"] == "16" and int(info.labels["num_gpu_blocks"]) > 0
    assert info.labels["enable_prefix_caching"] == "True"
    reasons = {sample.labels["finished_reason"] for sample in scrape.samples("vllm:request_success_total")}
    assert reasons == {"stop", "length"}
    # Renamed, not counted twice: the same values as surge's own series.
    assert scrape.value("vllm:prompt_tokens_total") == scrape.value("surge_prompt_tokens_total")
    ttft = scrape.value("vllm:time_to_first_token_seconds_count")
    assert ttft == scrape.value("surge_time_to_first_token_seconds_count") and ttft >= 1


def test_the_prefix_cache_counters_count_a_shared_prompt(live: LiveServer) -> None:
    before = Exposition(live)
    chat(live, "Where is the harbour?")
    chat(live, "When is high tide?")
    after = Exposition(live)
    queries = after.value("vllm:prefix_cache_queries_total") - before.value("vllm:prefix_cache_queries_total")
    hits = after.value("vllm:prefix_cache_hits_total") - before.value("vllm:prefix_cache_hits_total")
    assert 0 < hits <= queries
    assert after.value("vllm:prefix_cache_hits_total") == after.value("surge_prefix_cache_hit_tokens_total")


def test_waiting_running_and_kv_use_follow_a_running_stream_and_come_back(live: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
    started, done = threading.Event(), threading.Event()

    def stream() -> None:
        messages = [{"role": "user", "content": "Go on."}]
        chunks = client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_tokens=900, stream=True, extra_body={"ignore_eos": True}
        )
        for _ in chunks:
            started.set()
            if done.is_set():
                chunks.close()
                return

    worker = threading.Thread(target=stream)
    worker.start()
    try:
        assert started.wait(30)
        busy = Exposition(live)
        assert busy.value("vllm:num_requests_running") >= 1
        usage = busy.value("vllm:kv_cache_usage_perc")
        assert 0.0 < usage <= 1.0 and busy.value("vllm:gpu_cache_usage_perc") == usage
        assert busy.value("vllm:num_requests_waiting") == busy.value("surge_requests_waiting")
    finally:
        done.set()
        worker.join(30)
    live.wait_idle()
    deadline = time.monotonic() + 5
    while (idle := Exposition(live)).value("vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert idle.value("vllm:num_requests_running") == 0 and idle.value("vllm:kv_cache_usage_perc") == 0.0
