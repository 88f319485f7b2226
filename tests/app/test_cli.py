"""The `surge` command as a user runs it: a real process, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from scripts.harness.ports import free_port
from scripts.harness.servers import ServerProcess


def test_build_tiny_writes_a_hugging_face_directory(tmp_path: Path) -> None:
    out = tmp_path / "tiny-gpt2"
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "build-tiny", "--size", "s", "--arch", "gpt2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    assert (out / "model.safetensors").exists()
    assert (out / "tokenizer.json").exists()


def test_serve_answers_then_exits_cleanly_on_sigterm(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Settings from the environment, as a container passes them; SIGTERM drains and exits 0."""
    port = free_port()
    env = {**os.environ, "SURGE_PORT": str(port), "SURGE_MAX_MODEL_LEN": "256", "SURGE_SERVED_MODEL_NAME": "cli"}
    argv = [sys.executable, "-m", "app.cli", "serve", "--model", str(tiny_model_dir), "--max-num-seqs", "4"]
    server = ServerProcess("surge", argv, tmp_path / "surge.log", env=env, port=port)
    server.start()
    try:
        body = {"model": "cli", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body)
        assert reply.status_code == 200
        assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["max_model_len"] == 256
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0, server.tail()
    finally:
        server.stop(graceful=False)


def test_serve_exits_non_zero_when_the_model_cannot_load(tmp_path: Path) -> None:
    env = {**os.environ, "SURGE_PORT": str(free_port())}
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--model", str(tmp_path / "missing")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "could not start the engine" in proc.stderr


def test_the_engine_child_can_start_before_torch_is_imported() -> None:
    """`surge serve` spawns the engine process before importing the server (app/cli.py), so the
    child's imports and model load overlap the server's. What runs before the spawn (settings,
    logging, the spawn helper) must not import torch or transformers, or the overlap is lost."""
    code = (
        "import sys, app.cli, app.settings, app.diagnostics, models.engine_spawn;"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_surge_loadtest_says_where_the_load_tester_went() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "loadtest", "--concurrency", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "python -m scripts.loadtest" in proc.stderr
