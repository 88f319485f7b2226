"""The HPA's metric end to end: a real surge, a real Prometheus, the adapter's and KEDA's PromQL.

Prometheus (Debian's binary) scrapes the surge subprocess every second on loopback. The scrape
job adds the `namespace` and `pod` labels that Prometheus' kubernetes_sd relabelling adds in a
cluster, so the adapter rule's query runs here exactly as the adapter would send it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from scripts.harness.loopback import loopback
from tests.k8s.conftest import K8S, SERVED_MODEL, load_yaml, prometheus_scraping

NAMESPACE = "surge"
POD = "surge-0"
NUM_CLIENTS = 6  # one runs in the single KV slot, the rest queue


def metric_names(exposition: str) -> set[str]:
    names = set()
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def names_in(promql: str) -> set[str]:
    return set(re.findall(r"(?<![:\w])surge_[a-z_]+(?![:\w])", promql))


def adapter_query() -> str:
    """The adapter rule's metricsQuery as the adapter expands it for the HPA's pod list."""
    (rule,) = load_yaml(K8S / "prometheus-adapter" / "values.yaml")["rules"]["custom"]
    series = rule["seriesQuery"].split("{", 1)[0]
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"{POD}"')
        .replace("<<.GroupBy>>", "pod")
    )


def keda_query() -> str:
    (trigger,) = load_yaml(K8S / "keda" / "scaledobject.yaml")["spec"]["triggers"]
    return str(trigger["metadata"]["query"])


def test_autoscaling_metric_names_exist_in_a_running_server(surge_url: str) -> None:
    reply = loopback().get(f"{surge_url}/metrics", timeout=10)
    assert reply.status_code == 200
    exposed = metric_names(reply.text)
    hpa = load_yaml(K8S / "base" / "hpa.yaml")["spec"]["metrics"][0]["pods"]["metric"]["name"]
    used = {hpa} | names_in(adapter_query()) | names_in(keda_query())
    assert used == {"surge_requests_in_queue_per_worker"}
    assert used <= exposed, used - exposed


def test_dashboard_and_rules_use_only_exposed_metrics(surge_url: str) -> None:
    exposed = metric_names(loopback().get(f"{surge_url}/metrics", timeout=10).text)
    dashboard = (K8S / "grafana" / "surge-dashboard.json").read_text()
    rules = (K8S / "prometheus" / "surge-rules.yaml").read_text()
    used = names_in(dashboard) | names_in(rules)
    # Counters and histograms appear in the exposition under their sample names.
    assert used <= exposed, sorted(used - exposed)


@pytest.fixture
def prometheus(surge_url: str, tmp_path: Path) -> Iterator[str]:
    with prometheus_scraping({POD: surge_url}, NAMESPACE, tmp_path) as url:
        yield url


def query(prometheus: str, promql: str) -> float | None:
    reply = loopback().get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5).json()
    assert reply["status"] == "success", reply
    result = reply["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def wait_for(prometheus: str, promql: str, predicate: str, timeout: float) -> list[float | None]:
    seen: list[float | None] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = query(prometheus, promql)
        seen.append(value)
        if value is not None and (value > 0 if predicate == "positive" else value == 0):
            return seen
        time.sleep(0.25)
    raise AssertionError(f"{promql} never became {predicate}; saw {seen}")


async def hold_the_queue_until(surge_url: str, seen: Callable[[], None]) -> list[BaseException]:
    """NUM_CLIENTS streams that ask for far more tokens than the test waits for, all cancelled
    (their connections closed) once `seen` returns: the queue must then drain through the server's
    disconnect handling, however fast or slow this CPU decodes. Returns the streams' errors."""
    body = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(timeout=60, trust_env=False) as client:

        async def stream() -> None:
            async with client.stream("POST", f"{surge_url}/v1/chat/completions", json=body) as reply:
                assert reply.status_code == 200
                async for _ in reply.aiter_lines():
                    pass

        streams = [asyncio.create_task(stream()) for _ in range(NUM_CLIENTS)]
        try:
            await asyncio.to_thread(seen)
        finally:
            for task in streams:
                task.cancel()
            outcomes = await asyncio.gather(*streams, return_exceptions=True)
    return [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError)]


@pytest.mark.timeout(90)
def test_adapter_and_keda_queries_follow_the_load_up_and_back_down(surge_url: str, prometheus: str) -> None:
    queries = (adapter_query(), keda_query())
    for promql in queries:
        wait_for(prometheus, promql, "zero", timeout=15)  # scraped, and idle

    def positive() -> None:
        for promql in queries:
            wait_for(prometheus, promql, "positive", timeout=20)

    errors = asyncio.run(hold_the_queue_until(surge_url, positive))
    assert not errors, errors
    for promql in queries:
        wait_for(prometheus, promql, "zero", timeout=15)
