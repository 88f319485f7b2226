"""The `surge` command as a user runs it: a real process, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.ports import free_port


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


def test_serve_answers_then_exits_cleanly_on_sigterm(tiny_model_dir: Path) -> None:
    port = free_port()
    env = {**os.environ, "SURGE_PORT": str(port), "SURGE_MAX_MODEL_LEN": "256", "SURGE_SERVED_MODEL_NAME": "cli"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--model", str(tiny_model_dir), "--max-num-seqs", "4"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.1)
        body = {"model": "cli", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        reply = httpx.post(f"{base}/v1/chat/completions", json=body)
        assert reply.status_code == 200
        assert httpx.get(f"{base}/v1/models").json()["data"][0]["max_model_len"] == 256
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
