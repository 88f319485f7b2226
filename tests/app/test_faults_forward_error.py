"""A forward pass that raises, in the engine's own process: that batch's requests fail with a
500-class error, everything else is served, and the loop goes on.

The failure is injected through `SURGE_FAULT_FORWARD_ERROR_STEPS` (models/engine/faults.py), which
the engine process inherits from `surge serve`'s environment. Steps are counted after warmup,
so with one request at a time the failing step is known exactly:

1. one stream alone (prefill = step 1): step 5 fails it after 4 tokens: an error event, which
   the openai SDK raises as `APIError`, then `[DONE]`;
2. one JSON request alone (steps 6, 7): step 8 fails it: HTTP 500 in OpenAI's error shape;
3. ten requests at once behind `--max-num-seqs 2`: step 20 fails the (at most two) running,
   the others are untouched and complete;
4. afterwards /ready is still 200 and new requests succeed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from models.engine.faults import FORWARD_ERROR_STEPS_ENV
from models.engine.outputs import MODEL_FAILED
from scripts.harness.servers import start_surge
from tests.app.fault_tools import metric, wait_idle

ARGS = ("--served-model-name", "m", "--max-num-seqs", "2", "--max-model-len", "512", "--log-level", "warning")
STREAM_FAILS_AT, JSON_FAILS_AT, LOAD_FAILS_AT = 5, 8, 20
USER = [{"role": "user", "content": "fail me"}]


@dataclass
class Reply:
    is_stream: bool
    status: int = 0
    num_tokens: int = 0
    error: dict[str, object] | None = None  # the OpenAI error object: the JSON body's, or the error event's
    saw_done: bool = False


def request(url: str, *, stream: bool, max_tokens: int) -> Reply:
    body = {"model": "m", "messages": USER, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0}
    reply = Reply(stream)
    if not stream:
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        reply.status = response.status_code
        answer = response.json()
        reply.error = answer.get("error")
        reply.num_tokens = answer["usage"]["completion_tokens"] if "usage" in answer else 0
        return reply
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        reply.status = response.status_code
        for line in response.iter_lines():
            if line == "data: [DONE]":
                reply.saw_done = True
            elif line.startswith("data: "):
                chunk = json.loads(line.removeprefix("data: "))
                if "error" in chunk:
                    reply.error = chunk["error"]
                elif chunk.get("usage"):
                    reply.num_tokens = chunk["usage"]["completion_tokens"]
    return reply


def is_injected_server_error(error: dict[str, object] | None) -> bool:
    """The failed batch's error, in OpenAI's shape, without the exception's own text (that is in
    the log: paths, shapes and device details are not for clients)."""
    message = str(error["message"]) if error is not None else ""
    return (
        error is not None and error["type"] == "server_error" and MODEL_FAILED in message and "injected" not in message
    )


@pytest.fixture
def url(tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    steps = f"{STREAM_FAILS_AT},{JSON_FAILS_AT},{LOAD_FAILS_AT}"
    server = start_surge(tiny_model_dir, tmp_path / "surge.log", *ARGS, env={FORWARD_ERROR_STEPS_ENV: steps})
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop(graceful=False)


def test_a_failing_forward_pass_fails_its_batch_and_the_loop_goes_on(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)

    # 1. A stream: its tokens so far, then an error event; the SDK raises on it.
    deltas: list[str] = []
    with pytest.raises(openai.APIError, match=MODEL_FAILED):
        for chunk in client.chat.completions.create(
            model="m", messages=USER, max_tokens=50, stream=True, extra_body={"ignore_eos": True}
        ):
            deltas += [c.delta.content for c in chunk.choices if c.delta.content]
    assert 0 < len(deltas) <= STREAM_FAILS_AT - 1

    # 2. A JSON request: HTTP 500 with OpenAI's error body.
    failed = request(url, stream=False, max_tokens=50)
    assert failed.status == 500 and is_injected_server_error(failed.error)

    # 3. Under load, only the batch of the failing step fails.
    replies: list[Reply] = []
    lock = threading.Lock()

    def one(stream: bool) -> None:
        reply = request(url, stream=stream, max_tokens=20)
        with lock:
            replies.append(reply)

    threads = [threading.Thread(target=one, args=(i % 2 == 0,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failures = [r for r in replies if r.error is not None]
    assert 1 <= len(failures) <= 2, replies  # the running batch: at most --max-num-seqs
    for reply in failures:
        assert is_injected_server_error(reply.error)
        assert reply.status == (200 if reply.is_stream else 500)  # a stream had opened already
        assert reply.saw_done or not reply.is_stream
    assert all(r.status == 200 and r.num_tokens == 20 for r in replies if r.error is None)

    # 4. The loop lives on.
    wait_idle(url)
    assert httpx.get(f"{url}/ready").status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200
    after = client.chat.completions.create(model="m", messages=USER, max_tokens=8, extra_body={"ignore_eos": True})
    assert after.usage is not None and after.usage.completion_tokens == 8
    assert metric(url, "surge_requests_finished_total", finish_reason="error") == 2 + len(failures)
