"""Shared helpers for the k8s/ checks: overlays built by kustomize, a real `surge serve`, and a real
Prometheus scraping surge with k8s/prometheus/surge-rules.yaml loaded."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts.harness.servers import ServerProcess, surge_server

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = ("cpu", "gpu")
SERVED_MODEL = "tiny-k8s"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def kustomize(overlay: str) -> list[dict[str, Any]]:
    """The overlay's manifests as `kubectl kustomize` builds them (scripts/ensure-k8s-tools.sh)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl not found: run scripts/ensure-k8s-tools.sh (make k8s-tools)")
    proc = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}"
    return matches[0]


@pytest.fixture(scope="package")
def surge_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `surge serve` with one KV slot, so that concurrent requests queue."""
    log = tmp_path_factory.mktemp("surge") / "surge.log"
    args = ("--served-model-name", SERVED_MODEL, "--max-num-seqs", "1", "--max-model-len", "512")
    args += ("--degrade-thresholds", "off", "--dedup-ttl-seconds", "0")
    with surge_server(tiny_model_dir, log, *args, graceful_stop=False) as server:
        yield server.url


@contextlib.contextmanager
def prometheus_scraping(pods: Mapping[str, str], namespace: str, tmp_path: Path) -> Iterator[str]:
    """Prometheus (Debian's binary) scraping each surge URL every second as the named pod, with the
    `namespace` and `pod` labels that kubernetes_sd relabelling adds in a cluster, and surge's rule
    file loaded (both checked by promtool first); yields its URL."""
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if binary is None or promtool is None:
        pytest.fail("prometheus/promtool not found: run scripts/ensure-k8s-tools.sh (make k8s-tools)")
    rules = tmp_path / "surge-rules.yaml"
    rules.write_text((K8S / "prometheus" / "surge-rules.yaml").read_text())
    config = tmp_path / "prometheus.yml"
    targets = [
        {"targets": [url.removeprefix("http://")], "labels": {"namespace": namespace, "pod": pod}}
        for pod, url in pods.items()
    ]
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [{"job_name": "surge", "static_configs": targets}],
            }
        )
    )
    for what, path in (("config", config), ("rules", rules)):
        check = subprocess.run([promtool, "check", what, str(path)], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}"]
    argv += ["--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with ServerProcess("prometheus", argv, tmp_path / "prometheus.log", ready_path="/-/ready") as prometheus:
        yield prometheus.url
