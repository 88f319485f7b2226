"""Examples run as their users run them: a subprocess pointed at a live surge through the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_server import LiveServer, running_server

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Every limit is on (so the x-ratelimit-* headers are sent) and far above what the examples use.
GENEROUS_LIMITS = {"rate_limit_rpm": 100_000, "rate_limit_tpm": 100_000_000}


@pytest.fixture(scope="session")
def examples_server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    settings = {"max_model_len": 512, "max_num_seqs": 8, "max_num_batched_tokens": 128, **GENEROUS_LIMITS}
    with running_server(tiny_model_dir, **settings) as live:
        yield live


def example_env(base_url: str, **extra: str) -> dict[str, str]:
    """The examples' variables; SURGE_MODEL_NAME is left out so they find the model in /v1/models."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SURGE_")}
    return {**env, "SURGE_BASE_URL": f"{base_url}/v1", "PYTHONUNBUFFERED": "1", **extra}


def run_example(command: list[str], base_url: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run an example to completion; fails the test with its output when it exits non-zero."""
    proc = subprocess.run(
        command, env=example_env(base_url), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{command} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_python_example(name: str, base_url: str) -> subprocess.CompletedProcess[str]:
    return run_example([sys.executable, str(EXAMPLES / name)], base_url)


def metric_total(base_url: str, family: str) -> float:
    """A counter family from /metrics, summed over its label sets."""
    total = 0.0
    for line in httpx.get(f"{base_url}/metrics").text.splitlines():
        if line.startswith((family + "{", family + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total
