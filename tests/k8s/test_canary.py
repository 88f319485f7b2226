"""k8s/canary as kustomize builds it beside the cpu overlay, and the comparison it is for.

The manifests: a second Deployment whose pods no stable selector counts (Deployment, Service,
disruption budget, the routers' pools), that shares the stable pods' Redis and policies, and that
ingress-nginx (or a Gateway API route) gives 10% of the requests. The comparison: a real
Prometheus scraping a stable and a canary surge, with the rules the rollout is judged by.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from scripts.harness.loopback import loopback
from scripts.harness.servers import surge_server
from tests.k8s.conftest import K8S, SERVED_MODEL, find, kustomize, load_yaml, prometheus_scraping

CANARY = "app.kubernetes.io/component"
NGINX = "nginx.ingress.kubernetes.io/"
RULES = K8S / "prometheus" / "surge-rules.yaml"
ALERT = "SurgeModelVersionFailsMore"


def build(path: str) -> list[dict[str, Any]]:
    proc = subprocess.run(["kubectl", "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="module")
def stable() -> list[dict[str, Any]]:
    return kustomize("cpu")


@pytest.fixture(scope="module")
def canary() -> list[dict[str, Any]]:
    return build("canary")


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and In/NotIn expressions) matches `labels`."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        inside = labels.get(expression["key"]) in expression["values"]
        if inside != (expression["operator"] == "In"):
            return False
    return True


def pod_labels(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    labels: dict[str, str] = find(docs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_canary_is_its_own_deployment_beside_the_shared_state(canary: list[dict[str, Any]]) -> None:
    for doc in canary:
        kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)
    built = sorted((doc["kind"], doc["metadata"]["name"]) for doc in canary)
    assert built == [
        ("ConfigMap", "surge-config-canary"),
        ("Deployment", "surge-canary"),
        ("HorizontalPodAutoscaler", "surge-canary"),
        ("Ingress", "surge-canary"),
        ("NetworkPolicy", "surge-server-canary"),
        ("PodDisruptionBudget", "surge-canary"),
        ("Service", "surge-canary"),
    ]  # no second Redis: limits, idempotency keys and stored responses stay shared


def test_no_stable_selector_counts_the_canarys_pods(stable: list[dict[str, Any]], canary: list[dict[str, Any]]) -> None:
    """Overlapping selectors would let the stable Service, budget and HPA count canary pods, and two
    budgets over one pod make every eviction fail."""
    stable_pods, canary_pods = pod_labels(stable, "surge"), pod_labels(canary, "surge-canary")
    stable_selectors = [
        find(stable, "Deployment", "surge")["spec"]["selector"],
        {"matchLabels": find(stable, "Service", "surge")["spec"]["selector"]},
        find(stable, "PodDisruptionBudget", "surge")["spec"]["selector"],
        find(build("routers/endpoint-picker"), "InferencePool", "surge")["spec"]["selector"],
    ]
    canary_selectors = [
        find(canary, "Deployment", "surge-canary")["spec"]["selector"],
        {"matchLabels": find(canary, "Service", "surge-canary")["spec"]["selector"]},
        find(canary, "PodDisruptionBudget", "surge-canary")["spec"]["selector"],
    ]
    for selector in stable_selectors:
        assert selects(selector, stable_pods) and not selects(selector, canary_pods), selector
    for selector in canary_selectors:
        assert selects(selector, canary_pods) and not selects(selector, stable_pods), selector
    router = find(build("routers/production-stack"), "Deployment", "surge-router")
    (container,) = router["spec"]["template"]["spec"]["containers"]
    (flag,) = [arg for arg in container["args"] if arg.startswith("--k8s-label-selector=")]
    wanted = dict(pair.split("=", 1) for pair in flag.split("=", 1)[1].split(","))
    assert selects({"matchLabels": wanted}, stable_pods) and not selects({"matchLabels": wanted}, canary_pods)
    hpa = find(canary, "HorizontalPodAutoscaler", "surge-canary")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "surge-canary" and hpa["minReplicas"] == 1


def test_the_canary_runs_the_stable_pod_with_its_own_settings(
    stable: list[dict[str, Any]], canary: list[dict[str, Any]]
) -> None:
    """Only the model (and its version) and the labels differ: probes, drain, security, resources
    and the shared Redis URLs are the stable pod's."""
    old, new = find(stable, "Deployment", "surge"), find(canary, "Deployment", "surge-canary")
    (old_container,) = old["spec"]["template"]["spec"]["containers"]
    (new_container,) = new["spec"]["template"]["spec"]["containers"]
    assert new_container["envFrom"] == [{"configMapRef": {"name": "surge-config-canary"}}]
    assert {**new_container, "envFrom": old_container["envFrom"]} == old_container
    assert {**new["spec"]["template"]["spec"], "containers": []} == {
        **old["spec"]["template"]["spec"],
        "containers": [],
    }
    assert new["spec"]["template"]["metadata"]["annotations"] == old["spec"]["template"]["metadata"]["annotations"]
    old_settings = find(stable, "ConfigMap", "surge-config")["data"]
    new_settings = find(canary, "ConfigMap", "surge-config-canary")["data"]
    assert new_settings["SURGE_MODEL_VERSION"] != old_settings["SURGE_MODEL_VERSION"]
    differing = {
        key for key in old_settings.keys() | new_settings.keys() if old_settings.get(key) != new_settings.get(key)
    }
    assert differing <= {"SURGE_MODEL", "SURGE_MODEL_VERSION"}


def test_the_canary_reaches_the_shared_redis_and_nothing_else(
    stable: list[dict[str, Any]], canary: list[dict[str, Any]]
) -> None:
    canary_pods = pod_labels(canary, "surge-canary")
    redis_policy = find(stable, "NetworkPolicy", "surge-redis")["spec"]
    admitted = [peer["podSelector"] for rule in redis_policy["ingress"] for peer in rule["from"]]
    assert any(selects(selector, canary_pods) for selector in admitted)
    assert not any(selects(selector, {**canary_pods, CANARY: "client"}) for selector in admitted)
    own = find(canary, "NetworkPolicy", "surge-server-canary")["spec"]
    theirs = find(stable, "NetworkPolicy", "surge-server")["spec"]
    assert selects(own["podSelector"], canary_pods) and not selects(theirs["podSelector"], canary_pods)
    assert {**own, "podSelector": None} == {**theirs, "podSelector": None}


def test_ingress_nginx_sends_a_tenth_to_the_canary_on_the_stable_paths(
    stable: list[dict[str, Any]], canary: list[dict[str, Any]]
) -> None:
    """ingress-nginx pairs a canary Ingress with the main one by host and path; the canary's backend
    is its own Service, on a port it has."""
    main, side = find(stable, "Ingress", "surge"), find(canary, "Ingress", "surge-canary")
    notes = side["metadata"]["annotations"]
    assert notes[NGINX + "canary"] == "true" and notes[NGINX + "canary-weight"] == "10"
    assert notes[NGINX + "canary-by-header"] == "X-Surge-Canary"
    assert NGINX + "canary" not in main["metadata"]["annotations"]
    paths = [
        (rule.get("host"), path["path"], path["pathType"])
        for rule in side["spec"]["rules"]
        for path in rule["http"]["paths"]
    ]
    assert paths == [
        (rule.get("host"), path["path"], path["pathType"])
        for rule in main["spec"]["rules"]
        for path in rule["http"]["paths"]
    ]
    (backend,) = [path["backend"]["service"] for rule in side["spec"]["rules"] for path in rule["http"]["paths"]]
    service = find(canary, "Service", backend["name"])
    assert backend["port"]["name"] in [port["name"] for port in service["spec"]["ports"]]


def test_a_gateway_route_weighs_the_two_services_and_pins_by_header(
    stable: list[dict[str, Any]], canary: list[dict[str, Any]]
) -> None:
    (route,) = build("canary/gateway")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["kind"] == "HTTPRoute"
    services = {"surge": find(stable, "Service", "surge"), "surge-canary": find(canary, "Service", "surge-canary")}
    weights: dict[str, int] = {}
    pinned: dict[str, str] = {}
    for rule in route["spec"]["rules"]:
        (match,) = rule["matches"]
        assert match["path"] == {"type": "PathPrefix", "value": "/v1"}
        for ref in rule["backendRefs"]:
            assert ref["port"] in [port["port"] for port in services[ref["name"]]["spec"]["ports"]]
        headers = match.get("headers", [])
        if headers:
            ((header,), (ref,)) = (headers, rule["backendRefs"])
            assert header["name"] == "X-Surge-Canary"
            pinned[header["value"]] = ref["name"]
        else:
            weights = {ref["name"]: ref["weight"] for ref in rule["backendRefs"]}
    assert weights == {"surge": 90, "surge-canary": 10}
    assert pinned == {"always": "surge-canary", "never": "surge"}


# -- the comparison: a stable and a canary surge under one Prometheus --------------------------


@pytest.fixture(scope="module")
def canary_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The canary: version 2, one KV slot and one queue place, so a burst gets 503s from it."""
    log = tmp_path_factory.mktemp("canary") / "surge.log"
    args = ("--served-model-name", SERVED_MODEL, "--model-version", "2", "--max-num-seqs", "1")
    args += ("--max-queued-requests", "1", "--max-model-len", "512", "--degrade-thresholds", "off")
    with surge_server(tiny_model_dir, log, *args, graceful_stop=False) as server:
        yield server.url


def post(url: str, max_tokens: int) -> int:
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    body["ignore_eos"] = True
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code


def series(prometheus: str, promql: str) -> list[dict[str, Any]]:
    reply = loopback().get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5).json()
    assert reply["status"] == "success", reply
    result: list[dict[str, Any]] = reply["data"]["result"]
    return result


def by_version(prometheus: str, promql: str) -> dict[str, float]:
    return {each["metric"]["model_version"]: float(each["value"][1]) for each in series(prometheus, promql)}


@pytest.mark.timeout(120)
def test_the_rules_compare_the_versions_and_see_the_canary_fail_more(
    surge_url: str, canary_url: str, tmp_path: Path
) -> None:
    """The stable surge (`unversioned`) serves everything; a burst at the canary (version 2) gets
    503s from its full queue: the rules show each version's traffic, TTFT and 5xx share apart."""
    with prometheus_scraping({"surge-0": surge_url, "surge-canary-0": canary_url}, "surge", tmp_path) as prometheus:
        scraped = "count(up == 1)"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and [float(each["value"][1]) for each in series(prometheus, scraped)] != [2]:
            time.sleep(0.25)
        statuses: list[int] = []

        def one_at_the_canary() -> None:
            statuses.append(post(canary_url, 200))

        # Twice, two scrapes apart: a counter's series that first appears already counted (the
        # canary's first 503s) shows no increase to rate() until it grows again.
        for _ in range(2):
            statuses.extend(post(surge_url, 4) for _ in range(3))
            burst = [threading.Thread(target=one_at_the_canary) for _ in range(6)]
            for thread in burst:
                thread.start()
            for thread in burst:
                thread.join(timeout=60)
            time.sleep(2.5)
        assert 200 in statuses and 503 in statuses, statuses
        rules = "namespace_model_version:"
        deadline, seen = time.monotonic() + 45, {}
        while time.monotonic() < deadline:
            seen = {
                "rate": by_version(prometheus, rules + "http_requests:rate5m"),
                "5xx": by_version(prometheus, rules + "http_requests_5xx:ratio_rate5m"),
                "ttft": by_version(prometheus, rules + "surge_time_to_first_token_seconds:p90_5m"),
            }
            if all(set(values) == {"unversioned", "2"} for values in seen.values()) and seen["5xx"]["2"] > 0:
                break
            time.sleep(0.5)
        assert all(set(values) == {"unversioned", "2"} for values in seen.values()), seen
        assert seen["5xx"]["unversioned"] == 0 and 0 < seen["5xx"]["2"] < 1, seen
        assert all(value > 0 for value in seen["rate"].values()) and all(value > 0 for value in seen["ttft"].values())
        (alert,) = [
            rule for group in load_yaml(RULES)["groups"] for rule in group["rules"] if rule.get("alert") == ALERT
        ]
        assert series(prometheus, alert["expr"]), "the alert's condition holds"  # it fires after its `for`
