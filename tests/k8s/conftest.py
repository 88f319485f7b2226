"""Shared helpers for the k8s/ checks: overlays built by kustomize, and a real `surge serve`."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts.harness.servers import surge_server

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
