"""Shared helpers for the k8s/ checks: overlays built by kustomize, and a real `surge serve`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.ports import free_port

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


def wait_http_ok(url: str, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, f"{proc.args[0]} exited early: {proc.stdout.read() if proc.stdout else ''}"
        assert time.monotonic() < deadline, f"{url} never answered 200"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="package")
def surge_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `surge serve` with one KV slot, so that concurrent requests queue."""
    port = free_port()
    env = {**os.environ, "SURGE_PORT": str(port), "SURGE_HOST": "127.0.0.1"}
    log = tmp_path_factory.mktemp("surge") / "surge.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "app.cli", "serve", "--model", str(tiny_model_dir)),
                *("--served-model-name", SERVED_MODEL, "--max-num-seqs", "1", "--max-model-len", "512"),
                *("--degrade-thresholds", "off", "--dedup-ttl-seconds", "0"),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/ready", proc, timeout=90)
        yield url
    finally:
        stop(proc)
