"""scripts/naive_server.py (the bench's "one generate() at a time" peer): a real subprocess on the tiny
`s` model, one streamed request, the OpenAI SSE shape and the closing `[DONE]`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import httpx
import pytest

from models.loading.tiny import build_tiny
from scripts.harness.servers import ServerProcess


@pytest.fixture(scope="module")
def naive_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("naive")
    model_dir = build_tiny("s", root / "tiny-s")
    argv = [sys.executable, "-m", "scripts.naive_server", "--model", str(model_dir), "--port", "{port}"]
    with ServerProcess("naive", argv, root / "naive.log", ready_path="/health") as server:
        yield server.url


@pytest.mark.timeout(180)
def test_naive_server_streams_openai_chunks_then_done(naive_url: str) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "time year people way"}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", naive_url + "/v1/chat/completions", json=body, timeout=60.0) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]

    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and len(c["choices"]) == 1 for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert content and all(content)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 6  # ignore_eos: exactly max_tokens


@pytest.mark.timeout(120)
def test_naive_server_answers_without_streaming(naive_url: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "ignore_eos": True}
    response = httpx.post(naive_url + "/v1/chat/completions", json=body, timeout=60.0)
    assert response.status_code == 200
    payload = response.json()
    assert payload["object"] == "chat.completion"
    assert payload["usage"]["completion_tokens"] == 4
