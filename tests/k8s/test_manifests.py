"""k8s/ as kustomize builds it: schema-valid, and saying what docs/operations.md promises.

Schemas: the `kubernetes-validate` package's bundled Kubernetes JSON schemas, offline and strict
(unknown fields fail). KEDA's ScaledObject is a CRD the package has no schema for, so it is
checked field by field here instead.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from app.config.options import OPTIONS
from tests.k8s.conftest import K8S, OVERLAYS, find, kustomize, load_yaml

HPA_METRIC = "surge_requests_in_queue_per_worker"


@pytest.fixture(scope="module", params=OVERLAYS)
def built(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, kustomize(request.param)


def surge_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = find(docs, "Deployment", "surge")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "surge")


def test_every_built_manifest_validates_against_the_kubernetes_schemas(built: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = built
    kinds = {d["kind"] for d in docs}
    assert kinds == {
        "ConfigMap",
        "Deployment",
        "Service",
        "Ingress",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
    }
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)


def test_settings_are_known_surge_variables_and_the_key_comes_from_a_secret(
    built: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = built
    known = {option.env for option in OPTIONS}
    config = find(docs, "ConfigMap", "surge-config")["data"]
    assert set(config) <= known, set(config) - known
    assert config["SURGE_HOST"] == "0.0.0.0"
    assert "SURGE_REDIS_URL" not in config  # it carries the password: from the Secret
    assert find(docs, "Service", "surge-redis")["spec"]["ports"][0]["port"] == 6379
    container = surge_container(docs)
    assert container["envFrom"] == [{"configMapRef": {"name": "surge-config"}}]
    key = next(e for e in container["env"] if e["name"] == "SURGE_API_KEY")
    assert key["valueFrom"]["secretKeyRef"]["name"] == "surge-api-keys"
    # Every client comes through the ingress, with its address: no bound per address at the pod.
    assert config["SURGE_MAX_CONNECTIONS_PER_ADDRESS"] == "0"


def test_redis_fail_open_is_not_eager_and_never_exceeds_the_limits(built: tuple[str, list[dict[str, Any]]]) -> None:
    """The finding: a 50 ms Redis timeout (spurious outages under a burst's event-loop lag), and a
    fallback share of 1/2 while the HPA allows 10 replicas (5x the limits while Redis is away)."""
    _, docs = built
    config = find(docs, "ConfigMap", "surge-config")["data"]
    assert int(config["SURGE_REDIS_TIMEOUT_MS"]) >= 200
    hpa = find(docs, "HorizontalPodAutoscaler", "surge")["spec"]
    assert int(config["SURGE_RATE_LIMIT_REPLICAS"]) == hpa["maxReplicas"]
    # One key's burst cannot take every place of the queue.
    assert 0 < int(config["SURGE_MAX_CONCURRENT_PER_KEY"]) < int(config["SURGE_MAX_QUEUED_REQUESTS"])


def test_redis_needs_a_password_from_a_secret_and_only_surge_reaches_it(
    built: tuple[str, list[dict[str, Any]]],
) -> None:
    """The finding: Redis ran with no password and no NetworkPolicy, holding 24 h of completions
    that are replayed verbatim, for anything in the cluster to read or forge."""
    _, docs = built
    redis = find(docs, "Deployment", "surge-redis")["spec"]["template"]["spec"]["containers"][0]
    args = redis["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    redis_password = next(e for e in redis["env"] if e["name"] == "REDIS_PASSWORD")
    assert redis_password["valueFrom"]["secretKeyRef"] == {"name": "surge-redis-auth", "key": "password"}
    env = [e["name"] for e in surge_container(docs)["env"]]
    urls = {e["name"]: e.get("value") for e in surge_container(docs)["env"]}
    assert urls["SURGE_REDIS_URL"] == "redis://:$(REDIS_PASSWORD)@surge-redis:6379/0"
    assert urls["SURGE_REDIS_CACHE_URL"] == "redis://:$(REDIS_PASSWORD)@surge-redis-cache:6379/0"
    for name in ("SURGE_REDIS_URL", "SURGE_REDIS_CACHE_URL"):  # Kubernetes expands only earlier ones
        assert env.index("REDIS_PASSWORD") < env.index(name)
    cache = find(docs, "Deployment", "surge-redis-cache")["spec"]["template"]["spec"]["containers"][0]
    assert cache["args"][cache["args"].index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert cache["env"] == redis["env"]
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    server_labels = find(docs, "Deployment", "surge")["spec"]["selector"]["matchLabels"]
    redis_policy = policies["surge-redis"]
    selector = redis_policy["podSelector"]
    for name in ("surge-redis", "surge-redis-cache"):  # the policy selects both Redis, and nothing else
        labels = find(docs, "Deployment", name)["spec"]["selector"]["matchLabels"]
        assert selector["matchLabels"].items() <= labels.items()
        (expression,) = selector["matchExpressions"]
        assert labels[expression["key"]] in expression["values"] and expression["operator"] == "In"
    assert server_labels[expression["key"]] not in expression["values"]
    assert redis_policy["policyTypes"] == ["Ingress", "Egress"]
    canary_labels = {**server_labels, expression["key"]: "canary"}  # k8s/canary's pods share the state
    assert redis_policy["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": server_labels}}, {"podSelector": {"matchLabels": canary_labels}}],
            "ports": [{"port": 6379, "protocol": "TCP"}],
        }
    ]
    server_policy = policies["surge-server"]
    assert server_policy["podSelector"]["matchLabels"] == server_labels
    for rule in server_policy["ingress"]:
        assert all("namespaceSelector" in peer and "podSelector" not in peer for peer in rule["from"])


def test_pods_probe_drain_and_run_unprivileged(built: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = built
    deployment = find(docs, "Deployment", "surge")
    pod = deployment["spec"]["template"]["spec"]
    container = surge_container(docs)
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "model loading needs minutes"
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] >= pause + 120, "grace must cover the pause and a long stream"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "memory" in container["resources"]["limits"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert container["livenessProbe"]["httpGet"]["port"] == "metrics"  # never the API port's 503s
    pdb = find(docs, "PodDisruptionBudget", "surge")["spec"]
    assert pdb["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_pods_carry_no_api_token_bound_their_scratch_space_and_pin_redis_by_digest(
    built: tuple[str, list[dict[str, Any]]],
) -> None:
    """The finding: the service-account token mounted into pods that never call the API, emptyDir
    volumes without a sizeLimit (one pod fills the node's disk), images by a tag that can be
    re-pushed."""
    _, docs = built
    for name in ("surge", "surge-redis", "surge-redis-cache"):
        pod = find(docs, "Deployment", name)["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        for volume in pod["volumes"]:
            assert volume["emptyDir"]["sizeLimit"], (name, volume)
    for name in ("surge-redis", "surge-redis-cache"):
        redis = find(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        image, _, digest = redis["image"].partition("@sha256:")
        assert image.startswith("redis:") and len(digest) == 64 and int(digest, 16) >= 0


def test_no_memory_pressure_evicts_a_rate_limit_bucket(built: tuple[str, list[dict[str, Any]]]) -> None:
    """The finding: one Redis under `allkeys-lru` held the buckets beside 24 h of completions, so
    the caches' memory pressure could evict a bucket (a full one, for a caller past its limit).
    The buckets' Redis never evicts; the caches have a Redis of their own that may."""
    _, docs = built

    def policy(name: str) -> str:
        args = find(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--maxmemory" in args
        return str(args[args.index("--maxmemory-policy") + 1])

    assert policy("surge-redis") == "noeviction"
    assert policy("surge-redis-cache") == "allkeys-lru"
    assert find(docs, "Service", "surge-redis-cache")["spec"]["ports"][0]["port"] == 6379


def test_the_metrics_key_comes_from_an_optional_secret(built: tuple[str, list[dict[str, Any]]]) -> None:
    """`/metrics` can need a Bearer key in the cluster without the key in the ConfigMap; without
    the Secret the pod still starts (and /metrics is open to what the NetworkPolicy admits)."""
    _, docs = built
    assert "SURGE_METRICS_KEY" not in find(docs, "ConfigMap", "surge-config")["data"]
    key = next(e for e in surge_container(docs)["env"] if e["name"] == "SURGE_METRICS_KEY")
    assert key["valueFrom"]["secretKeyRef"] == {"name": "surge-metrics-key", "key": "key", "optional": True}


def test_metrics_are_scraped_on_a_port_of_their_own_that_only_prometheus_reaches(
    built: tuple[str, list[dict[str, Any]]],
) -> None:
    """The finding: /metrics was on the API port, open with auth on unless --metrics-key was given,
    and showed every tenant's traffic. The pods serve it on SURGE_METRICS_PORT (a container port
    named `metrics`), which Prometheus' annotation and scrape job use; only the `monitoring`
    namespace reaches that port, only the ingress controller the API port; the Service (so the
    ingress) carries the API port alone."""
    _, docs = built
    port = int(find(docs, "ConfigMap", "surge-config")["data"]["SURGE_METRICS_PORT"])
    api_port = int(find(docs, "ConfigMap", "surge-config")["data"]["SURGE_PORT"])
    ports = {p["name"]: p["containerPort"] for p in surge_container(docs)["ports"]}
    assert ports == {"http": api_port, "metrics": port} and port != api_port
    annotations = find(docs, "Deployment", "surge")["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == port
    assert [p["targetPort"] for p in find(docs, "Service", "surge")["spec"]["ports"]] == ["http"]
    server_policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "surge-server")
    admitted = {
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]: [p["port"] for p in rule["ports"]]
        for rule in server_policy["spec"]["ingress"]
        for peer in rule["from"]
    }
    assert admitted == {"ingress-nginx": [api_port], "monitoring": [port]}


def test_the_scrape_job_keeps_only_the_metrics_port_of_surges_pods() -> None:
    """k8s/prometheus/scrape-config.yaml's relabelling, run on the targets Prometheus' pod discovery
    makes (one per container port): the metrics port stays, with `namespace` and `pod`."""
    (job,) = load_yaml(K8S / "prometheus" / "scrape-config.yaml")["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (discovery,) = job["kubernetes_sd_configs"]
    assert discovery["role"] == "pod" and discovery["namespaces"]["names"] == ["surge"]

    def target(port_name: str, port: int, scrape: str = "true") -> dict[str, str]:
        return {
            "__address__": f"10.0.0.7:{port}",
            "__meta_kubernetes_namespace": "surge",
            "__meta_kubernetes_pod_name": "surge-0",
            "__meta_kubernetes_pod_container_port_name": port_name,
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": scrape,
        }

    targets = (target("http", 8000), target("metrics", 8001), target("metrics", 8001, scrape="false"))
    kept = [labels for labels in (relabel(t, job["relabel_configs"]) for t in targets) if labels is not None]
    assert kept == [{**target("metrics", 8001), "namespace": "surge", "pod": "surge-0"}]


def relabel(labels: dict[str, str], configs: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus' `keep` and `replace` (its default action) relabelling; None: dropped."""
    labels = dict(labels)
    for config in configs:
        value = config.get("separator", ";").join(labels.get(name, "") for name in config["source_labels"])
        match = re.fullmatch(config.get("regex", "(.*)"), value)
        action = config.get("action", "replace")
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is not None:
                labels[config["target_label"]] = match.expand(config.get("replacement", r"\1"))
        else:
            raise AssertionError(f"relabel action {action} is not simulated here")
    return labels


def test_the_scrape_job_passes_promtool(tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes discovery: the job is checked with static
    targets in its place, everything else as written."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run scripts/ensure-k8s-tools.sh (make k8s-tools)")
    config = load_yaml(K8S / "prometheus" / "scrape-config.yaml")
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": ["127.0.0.1:8001"]}]
        del job["kubernetes_sd_configs"]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_compromised_pod_cannot_reach_the_cloud_metadata_address(built: tuple[str, list[dict[str, Any]]]) -> None:
    """The finding: the NetworkPolicies had no egress rules, so a compromised pod reached
    169.254.169.254 (the node's cloud credentials) and anything else in the cluster. surge's pods may
    reach the DNS, the two Redis and HTTPS on public addresses (the model's download from the hub);
    Redis' pods the DNS only."""
    _, docs = built
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    server, redis = policies["surge-server"], policies["surge-redis"]
    assert "Egress" in server["policyTypes"] and "Egress" in redis["policyTypes"]
    for policy in (server, redis):
        for rule in policy["egress"]:
            assert rule.get("to") and rule.get("ports"), rule  # no rule opens every address or port
    metadata = ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254")
    cluster = ("10.96.0.1", "172.20.0.10", "192.168.1.1", "fe80::1")
    for address in metadata + cluster:
        for port in (80, 443, 53, 6379):
            assert not reachable(server, address, port), (address, port)
            assert not reachable(redis, address, port), (address, port)
    assert reachable(server, "18.160.0.1", 443) and reachable(server, "2600:9000::1", 443)  # the hub's CDN
    assert not reachable(server, "18.160.0.1", 80) and not reachable(redis, "18.160.0.1", 443)
    dns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
    for policy in (server, redis):
        (dns_rule,) = [rule for rule in policy["egress"] if any(p["port"] == 53 for p in rule["ports"])]
        assert {(p["port"], p["protocol"]) for p in dns_rule["ports"]} == {(53, "UDP"), (53, "TCP")}
        (peer,) = dns_rule["to"]
        assert peer.items() >= dns.items() and peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    redis_labels = find(docs, "Deployment", "surge-redis")["spec"]["selector"]["matchLabels"]
    (redis_rule,) = [rule for rule in server["egress"] if any(p["port"] == 6379 for p in rule["ports"])]
    (peer,) = redis_rule["to"]
    assert set(peer) == {"podSelector"} and peer["podSelector"]["matchLabels"].items() <= redis_labels.items()


def reachable(policy: dict[str, Any], address: str, port: int) -> bool:
    """Whether an egress rule of `policy` admits `address`:`port` by IP (pod and namespace selectors
    match pods of the cluster, never an address outside it such as the metadata service's)."""
    ip = ipaddress.ip_address(address)
    for rule in policy.get("egress", []):
        if all(p["port"] != port for p in rule["ports"]):
            continue
        for peer in rule["to"]:
            block = peer.get("ipBlock")
            if block is None or ip.version != ipaddress.ip_network(block["cidr"]).version:
                continue
            if ip in ipaddress.ip_network(block["cidr"]) and not any(
                ip in ipaddress.ip_network(excluded) for excluded in block.get("except", [])
            ):
                return True
    return False


def test_the_ingress_hashes_sessions_and_keys_to_few_replicas_and_streams_unbuffered(
    built: tuple[str, list[dict[str, Any]]],
) -> None:
    """The prefix cache is per replica: a conversation (X-Session-Id) or else an API key goes to
    a subset of 3 replicas, not to any; SSE is not buffered by the proxy."""
    _, docs = built
    ingress = find(docs, "Ingress", "surge")
    notes = ingress["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert notes[prefix + "upstream-hash-by"] == "$http_x_session_id$http_authorization"
    assert (notes[prefix + "upstream-hash-by-subset"], notes[prefix + "upstream-hash-by-subset-size"]) == ("true", "3")
    assert notes[prefix + "proxy-buffering"] == "off"
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["path"] == "/v1" and path["backend"]["service"] == {"name": "surge", "port": {"name": "http"}}


def test_hpa_scales_on_queue_per_worker_fast_up_slow_down(built: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = built
    spec = find(docs, "HorizontalPodAutoscaler", "surge")["spec"]
    (metric,) = spec["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == HPA_METRIC
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "5"}
    behavior = spec["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300


def test_overlays_differ_only_where_the_hardware_does(built: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = built
    pod = find(docs, "Deployment", "surge")["spec"]["template"]["spec"]
    container = surge_container(docs)
    device = find(docs, "ConfigMap", "surge-config")["data"]["SURGE_DEVICE"]
    if overlay == "gpu":
        assert device == "cuda"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert "cuda" in container["image"].split(":")[-1]
        assert pod["nodeSelector"]
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    else:
        assert device == "cpu"
        assert "nvidia.com/gpu" not in container["resources"]["limits"]
        assert "nodeSelector" not in pod


def test_adapter_rule_and_keda_trigger_serve_the_hpa_metric() -> None:
    (rule,) = load_yaml(K8S / "prometheus-adapter" / "values.yaml")["rules"]["custom"]
    assert rule["name"]["as"] == HPA_METRIC
    assert rule["seriesQuery"].startswith(HPA_METRIC + "{")
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    scaled = load_yaml(K8S / "keda" / "scaledobject.yaml")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == "surge"
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert HPA_METRIC in trigger["metadata"]["query"]
    assert trigger["metadata"]["threshold"] == "5"
    hpa = load_yaml(K8S / "base" / "hpa.yaml")["spec"]
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (hpa["minReplicas"], hpa["maxReplicas"])


def test_prometheus_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run scripts/ensure-k8s-tools.sh (make k8s-tools)")
    proc = subprocess.run(
        [promtool, "check", "rules", str(K8S / "prometheus" / "surge-rules.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_panels_cover_the_main_metrics() -> None:
    dashboard = json.loads((K8S / "grafana" / "surge-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    for name in (
        "surge_generation_tokens_total",
        "surge_time_to_first_token_seconds_bucket",
        "surge_e2e_request_latency_seconds_bucket",
        "surge_requests_waiting",
        "surge_requests_running",
        HPA_METRIC,
        "surge_degradation_level",
        "surge_kv_cache_usage_ratio",
    ):
        assert name in exprs, name
    assert exprs.count("histogram_quantile(") >= 9
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
