"""The `surge` command as a user runs it: a real process, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.config.settings import Settings
from app.server.factory import warn_if_open
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
        "import sys, app.cli, app.config.settings, app.ops.diagnostics, models.process.spawn;"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def surge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The `surge` command run to its end (one that exits at start)."""
    argv = [sys.executable, "-m", "app.cli", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_surge_loadtest_says_where_the_load_tester_went() -> None:
    proc = surge("loadtest", "--concurrency", "2")
    assert proc.returncode == 2 and "python -m scripts.loadtest" in proc.stderr


def test_an_empty_api_key_variable_stops_the_server_instead_of_turning_auth_off() -> None:
    """The attack surface: a Secret that rendered empty (SURGE_API_KEY="") used to start a server
    with auth silently off."""
    for value in ("", " , "):
        proc = surge(
            "serve", "--model", "echo", env={**os.environ, "SURGE_PORT": str(free_port()), "SURGE_API_KEY": value}
        )
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "SURGE_API_KEY is set but holds no key" in proc.stderr
    proc = surge("serve", "--model", "echo", "--api-key", "", env={**os.environ, "SURGE_PORT": str(free_port())})
    assert proc.returncode == 2 and "--api-key needs a key" in proc.stderr


def test_auth_off_on_a_public_address_is_a_warning_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("SURGE_")}
    argv = [sys.executable, "-m", "app.cli", "serve", "--model", "echo", "--host", "0.0.0.0", "--port", str(port)]
    server = ServerProcess("surge", argv, tmp_path / "surge.log", env=env, port=port)
    server.start()
    try:
        log = (tmp_path / "surge.log").read_text()
        assert "auth is off" in log, log[-2000:]
    finally:
        server.stop(graceful=False)  # its shutdown is the SIGTERM test's; a graceful one paid a 2 s drain delay
    # Nothing to warn about: loopback without a key, any address with one (checked in this
    # process: a server start per case costs seconds of CI).
    with caplog.at_level("WARNING", logger="surge.server"):
        warn_if_open(Settings(host="127.0.0.1"))
        warn_if_open(Settings(host="0.0.0.0", api_key=("sk-x",)))
        assert "auth is off" not in caplog.text
        warn_if_open(Settings(host="0.0.0.0"))  # the control
        assert "auth is off" in caplog.text
