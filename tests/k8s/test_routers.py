"""k8s/routers/ as kustomize builds it: the endpoint picker's and production-stack's components, their
core objects valid against the Kubernetes schemas, their custom resources (InferencePool,
HTTPRoute) checked field by field, and every reference between them and surge's own manifests
(labels, ports, the metrics port the picker scrapes, the network paths) pointing where it must."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.k8s.conftest import K8S, find, kustomize

CUSTOM = {"InferencePool", "HTTPRoute"}


def build(component: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        ["kubectl", "kustomize", str(K8S / "routers" / component)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="module")
def surge() -> dict[str, Any]:
    """surge's server Deployment as the cpu overlay builds it."""
    return find(kustomize("cpu"), "Deployment", "surge")


def container_port(deployment: dict[str, Any], name: str) -> int:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return next(int(port["containerPort"]) for port in container["ports"] if port["name"] == name)


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def args_of(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])


@pytest.mark.parametrize("component", ["endpoint-picker", "production-stack"])
def test_core_objects_validate_and_pods_run_unprivileged(component: str) -> None:
    docs = build(component)
    for doc in docs:
        if doc["kind"] not in CUSTOM:
            kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] and spec["serviceAccountName"]
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
            assert context["capabilities"]["drop"] == ["ALL"]
            assert "memory" in container["resources"]["limits"]
    roles = [d for d in docs if d["kind"] == "Role"]
    assert roles and all(rule["verbs"] == ["get", "list", "watch"] for role in roles for rule in role["rules"])


def test_the_pool_selects_surges_pods_and_names_its_picker(surge: dict[str, Any]) -> None:
    docs = build("endpoint-picker")
    pool = find(docs, "InferencePool", "surge")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    assert spec["selector"]["matchLabels"] == pod_labels(surge)
    assert [port["number"] for port in spec["targetPorts"]] == [container_port(surge, "http")]
    picker = find(docs, "Service", spec["endpointPickerRef"]["name"])
    assert spec["endpointPickerRef"]["port"]["number"] in [port["port"] for port in picker["spec"]["ports"]]
    assert spec["endpointPickerRef"]["failureMode"] in ("FailOpen", "FailClose")
    epp = find(docs, "Deployment", "surge-epp")
    assert picker["spec"]["selector"] == pod_labels(epp)
    route = find(docs, "HTTPRoute", "surge")
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        "surge",
    )


def test_the_picker_scrapes_surges_metrics_port_and_scores_by_prefix(surge: dict[str, Any]) -> None:
    docs = build("endpoint-picker")
    epp = find(docs, "Deployment", "surge-epp")
    args = args_of(epp)
    assert args["pool-name"] == "surge" and int(args["model-server-metrics-port"]) == container_port(surge, "metrics")
    config = yaml.safe_load(find(docs, "ConfigMap", "surge-epp-config")["data"]["epp.yaml"])
    assert config["kind"] == "EndpointPickerConfig"
    declared = {plugin["type"] for plugin in config["plugins"]}
    (profile,) = config["schedulingProfiles"]
    used = {ref["pluginRef"] for ref in profile["plugins"]}
    assert used == declared and {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} <= used
    # The picker's pods reach the metrics port; the picker reads the pool and its pods, nothing else.
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"] == pod_labels(surge)
    from_picker = [rule for rule in policy["spec"]["ingress"] if "podSelector" in rule["from"][0]]
    assert from_picker[0]["from"][0]["podSelector"]["matchLabels"] == pod_labels(epp)
    assert [port["port"] for port in from_picker[0]["ports"]] == [container_port(surge, "metrics")]


def test_the_production_stack_router_finds_surges_pods_and_keeps_users_on_theirs(surge: dict[str, Any]) -> None:
    docs = build("production-stack")
    router = find(docs, "Deployment", "surge-router")
    args = args_of(router)
    selector = dict(pair.split("=") for pair in args["k8s-label-selector"].split(","))
    assert selector == pod_labels(surge) and int(args["k8s-port"]) == container_port(surge, "http")
    assert (args["routing-logic"], args["session-key"]) == ("session", "x-user-id")
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"] == pod_labels(router)
    assert [port["port"] for port in rule["ports"]] == [container_port(surge, "http")]


def test_each_component_is_documented() -> None:
    fleet = (Path(K8S).parent / "docs" / "fleet.md").read_text()
    for component in ("endpoint-picker", "production-stack"):
        assert f"k8s/routers/{component}" in fleet
