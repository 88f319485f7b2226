"""The log of a real `surge serve --log-format json`: JSON lines, request ids, no prompts or keys."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx

from scripts.harness.servers import surge_server

API_KEY = "sk-distinctive-key-7f3a91"
WRONG_KEY = "sk-wrong-distinctive-key-55c2"
PROMPT = "zebra-unicorn-distinctive-prompt-5521"
REQUEST_ID = "trace-logging-1"


def test_json_log_has_request_ids_startup_progress_and_never_prompts_or_keys(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ("--log-format", "json", "--api-key", API_KEY, "--served-model-name", "m", "--shutdown-delay-seconds", "0")
    with surge_server(tiny_model_dir, tmp_path / "surge.log", *args, graceful_stop=False) as server:
        body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
        reply = httpx.post(
            f"{server.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {API_KEY}", "X-Request-Id": REQUEST_ID},
        )
        assert reply.status_code == 200
        assert reply.headers["X-Request-Id"] == REQUEST_ID
        rejected = httpx.post(
            f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {WRONG_KEY}"}
        )
        assert rejected.status_code == 401
        assert rejected.headers["X-Request-Id"]
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        text = server.log()

    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    mine = [line for line in access if "POST /v1/chat/completions" in line["message"] and " 200" in line["message"]]
    assert [line.get("request_id") for line in mine] == [REQUEST_ID]
    assert all(line.get("request_id") for line in access)
    assert not any(line.get("request_id") for line in lines if line["logger"] == "surge.loader")

    # Start-up progress, in order.
    messages = [line["message"] for line in lines]
    steps = ["resolving model", "loading tokenizer", "loading weights", "warming up", "warmup done", "ready: serving"]
    positions = [next(i for i, m in enumerate(messages) if m.startswith(step)) for step in steps]
    assert positions == sorted(positions)
    assert "MiB" in messages[positions[2]]

    for secret in (PROMPT, API_KEY, WRONG_KEY):
        assert secret not in text


def test_text_log_carries_the_request_id(tiny_model_dir: Path, tmp_path: Path) -> None:
    with surge_server(
        tiny_model_dir, tmp_path / "surge.log", "--shutdown-delay-seconds", "0", graceful_stop=False
    ) as server:
        assert httpx.get(f"{server.url}/v1/models", headers={"X-Request-Id": "text-trace-9"}).status_code == 200
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        text = server.log()
    assert any("[text-trace-9]" in line and "GET /v1/models" in line for line in text.splitlines())
