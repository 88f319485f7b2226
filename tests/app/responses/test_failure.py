"""A forward pass that fails mid-reply, in a real `surge serve`: a streamed Response ends with a
valid `response.failed` carrying the fixed error sentence; a whole one is an HTTP 500 in OpenAI's
error shape; the server serves on.

Steps are counted after warmup (models/engine/faults.py): the stream's prefill is step 1, so step
4 fails it after 3 tokens; the JSON request's prefill is step 5, so step 7 fails it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from models.engine.faults import FORWARD_ERROR_STEPS_ENV
from models.engine.outputs import MODEL_FAILED
from scripts.harness.servers import start_surge
from tests.openai_wire import assert_openai

ARGS = ("--served-model-name", "m", "--max-model-len", "512", "--log-level", "warning")
BODY = {"model": "m", "input": "fail me", "max_output_tokens": 30, "ignore_eos": True}


@pytest.fixture
def url(tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    server = start_surge(tiny_model_dir, tmp_path / "surge.log", *ARGS, env={FORWARD_ERROR_STEPS_ENV: "4,7"})
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop(graceful=False)


def test_a_failed_forward_pass_is_a_failed_response_and_the_server_serves_on(url: str) -> None:
    with httpx.stream("POST", f"{url}/v1/responses", json={**BODY, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    for event in events:
        assert_openai(event, "ResponseStreamEvent")
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    deltas = [event for event in events if event["type"] == "response.output_text.delta"]
    assert 0 < len(deltas) <= 3
    last = events[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    error = last["response"]["error"]
    assert error["code"] == "server_error" and MODEL_FAILED in error["message"] and "injected" not in error["message"]

    whole = httpx.post(f"{url}/v1/responses", json=BODY, timeout=60)
    assert whole.status_code == 500 and MODEL_FAILED in whole.json()["error"]["message"]
    assert_openai(whole.json(), "ErrorResponse")

    assert httpx.get(f"{url}/ready", timeout=10).status_code == 200
    again = httpx.post(f"{url}/v1/responses", json=BODY, timeout=60)
    assert again.status_code == 200 and again.json()["usage"]["output_tokens"] == 30
