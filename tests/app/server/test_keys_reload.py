"""Revoking a key without a restart: the keys file reloaded when it changes, and on SIGHUP.

In-process servers for the poll (tests/live_server.py); a `surge serve` subprocess for SIGHUP,
which the server takes on its main thread only.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from scripts.harness.servers import surge_server
from tests.live_server import MODEL_NAME, running_server

USER = [{"role": "user", "content": "Tell me about the sea."}]


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def models(url: str, key: str) -> int:
    return httpx.get(f"{url}/v1/models", headers=bearer(key), timeout=10).status_code


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("never happened")
        time.sleep(0.02)


def test_a_revoked_key_is_refused_after_the_keys_file_changes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The attack: a leaked key, removed from the keys file, went on working until a restart, and
    nothing said so. The file is now looked at every --keys-file-reload-seconds: from the first
    request after the reload the key is refused; its request already in flight runs to its end."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-leaked:\nsk-kept: {tier: 1}\n")
    settings = {"max_model_len": 2048, "keys_file": str(keys), "keys_file_reload_seconds": 0.05}
    with running_server(tiny_model_dir, **settings) as live:
        body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 1500, "ignore_eos": True, "stream": True}
        url = f"{live.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=bearer("sk-leaked"), timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")  # in flight
            keys.write_text("sk-kept: {tier: 1}\nsk-added:\n")
            wait_until(lambda: models(live.url, "sk-leaked") == 401)
            assert live.engine.core.num_running == 1  # still generating for the revoked key
            rest = list(lines)
        assert "data: [DONE]" in rest
        assert models(live.url, "sk-kept") == 200
        assert models(live.url, "sk-added") == 200
        assert live.state.keys.current.tiers == {b"sk-kept": 1}


def test_a_keys_new_limits_apply_from_the_next_request(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A reload changes what a key may do, not only whether it is accepted: the rate-limit layer
    goes by the key set the request was authenticated against."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-tenant: {rpm: 100}\n")
    settings = {"max_model_len": 256, "keys_file": str(keys), "keys_file_reload_seconds": 0.05}
    with running_server(tiny_model_dir, **settings) as live:

        def chat() -> httpx.Response:
            body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 1}
            return httpx.post(f"{live.url}/v1/chat/completions", json=body, headers=bearer("sk-tenant"), timeout=30)

        assert chat().headers["x-ratelimit-limit-requests"] == "100"
        keys.write_text("sk-tenant: {rpm: 1}\n")
        wait_until(lambda: live.state.keys.current.rate_limits["sk-tenant"].rpm == 1)
        assert chat().headers["x-ratelimit-limit-requests"] == "1"
        assert chat().status_code == 429


def test_a_keys_file_that_does_not_parse_keeps_the_keys_in_use(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A half-edited file must neither lock every tenant out nor put its lines (API keys) in the log."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-tenant-one:\n")
    settings = {"max_model_len": 256, "keys_file": str(keys), "keys_file_reload_seconds": 0.05}
    with caplog.at_level(logging.ERROR, logger="surge.keys"), running_server(tiny_model_dir, **settings) as live:
        keys.write_text("sk-tenant-one:\nsk-tenant-two: {rpm: [\n")
        wait_until(lambda: "not valid YAML" in caplog.text)
        assert models(live.url, "sk-tenant-one") == 200
        assert models(live.url, "sk-tenant-two") == 401
        assert "sk-tenant" not in caplog.text
        keys.write_text("sk-tenant-two:\n")
        wait_until(lambda: models(live.url, "sk-tenant-two") == 200)
        assert models(live.url, "sk-tenant-one") == 401


def test_a_revoked_key_is_refused_after_sighup(tmp_path: Path) -> None:
    """With the poll off, SIGHUP reloads the file (the key is refused from then on). A hangup sent to
    the whole process group (a terminal's, `timeout`'s) reloads too and leaves the engine's process
    alone; SIGTERM still drains and exits 0 after."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-leaked:\nsk-kept:\n")
    args = ("--keys-file", str(keys), "--keys-file-reload-seconds", "0", "--shutdown-delay-seconds", "0")
    with surge_server("echo", tmp_path / "surge.log", *args) as server:
        keys.write_text("sk-kept:\n")
        assert models(server.url, "sk-leaked") == 200  # no poll: in force until the signal
        os.kill(server.pid, signal.SIGHUP)
        server.wait_for_log("reloaded: 1 keys (0 added, 1 removed)")
        assert models(server.url, "sk-leaked") == 401
        assert models(server.url, "sk-kept") == 200
        keys.write_text("sk-kept:\nsk-new:\n")
        os.killpg(server.pid, signal.SIGHUP)
        server.wait_for_log("reloaded: 2 keys (1 added, 0 removed)")
        reply = httpx.post(
            f"{server.api}/chat/completions",
            json={"model": "echo", "messages": USER, "max_tokens": 2},
            headers=bearer("sk-new"),
            timeout=30,
        )
        assert reply.status_code == 200, reply.text  # the engine's process took the hangup too, and lives
    assert server.proc is not None and server.proc.returncode == 0, server.tail()
