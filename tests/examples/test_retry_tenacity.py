"""examples/retry_tenacity.py against real 503s and 429s: it waits what the server asks, retries with
one Idempotency-Key, and the model runs once."""

from __future__ import annotations

import importlib.util
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import httpx
import openai
import pytest

from tests.examples.conftest import EXAMPLES, example_env, metric_total
from tests.live_server import MODEL_NAME, running_server

USER = [{"role": "user", "content": "Tell me about the sea."}]
LONG = {"model": MODEL_NAME, "messages": USER, "max_tokens": 2000, "ignore_eos": True, "stream": True}


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("retry_tenacity", EXAMPLES / "retry_tenacity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def forward_lines(proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    """The example's stderr, line by line, so the test can wait for its first retry with a timeout."""
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.put(line)


def test_retries_503s_honouring_retry_after_and_runs_the_model_once(tiny_model_dir: Path) -> None:
    settings = {"max_model_len": 2048, "max_num_seqs": 1, "max_queued_requests": 1}
    with running_server(tiny_model_dir, **settings) as live:
        url = f"{live.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=LONG) as running:
            lines = running.iter_lines()  # keep it: a dropped iterator closes the response
            next(lines)
            with httpx.stream("POST", url, json=LONG) as queued:
                assert queued.status_code == 200  # one waiting: the queue is full, new requests get 503
                proc = subprocess.Popen(
                    [sys.executable, str(EXAMPLES / "retry_tenacity.py")],
                    env=example_env(live.url),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                stderr_lines: queue.Queue[str] = queue.Queue()
                reader = threading.Thread(target=forward_lines, args=(proc, stderr_lines), daemon=True)
                reader.start()
                first_retry = ""
                while "attempt 1 failed" not in first_retry:  # skip anything else it prints first
                    first_retry = stderr_lines.get(timeout=30)
        # Both streams are closed now: the server aborts them and the example's next attempt runs.
        stdout, _ = proc.communicate(timeout=60)
        reader.join(5)
        assert proc.returncode == 0, stdout
        assert "attempt 1 failed (HTTP 503)" in first_retry
        server_asked = float(re.search(r"server asked ([\d.]+) s", first_retry).group(1))  # type: ignore[union-attr]
        slept = float(re.search(r"retrying in ([\d.]+) s", first_retry).group(1))  # type: ignore[union-attr]
        assert server_asked >= 1.0 and server_asked <= slept <= server_asked * 1.1 + 0.01
        attempts = int(re.search(r"^attempts=(\d+)", stdout, re.MULTILINE).group(1))  # type: ignore[union-attr]
        assert attempts >= 2
        assert "again: attempts=1 replayed=True same_text=True" in stdout
        # Ran once: the two blockers were aborted, the 503s never reached the engine, the second
        # call was a replay from the idempotency store.
        assert metric_total(live.url, "surge_requests_finished_total") == 1
        assert metric_total(live.url, "surge_idempotent_replays_total") == 1


def drain_requests_bucket(base_url: str) -> None:
    """Spend the requests bucket until a 429 says the next token is at least 300 ms away."""
    url = f"{base_url}/v1/chat/completions"
    with httpx.Client() as client:
        for _ in range(1000):
            response = client.post(url, json={})  # takes a token, then fails validation (400)
            if response.status_code == 429:
                wait_s = int(response.headers["retry-after-ms"]) / 1000
                if wait_s >= 0.3:
                    return
                time.sleep(wait_s)  # nearly refilled: take that token too
    raise AssertionError("never rate limited")


def test_retries_a_429_after_retry_after_ms_and_not_a_400(tiny_model_dir: Path) -> None:
    retry_tenacity = load_example()
    with running_server(tiny_model_dir, max_model_len=512, rate_limit_rpm=60) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused")
        drain_requests_bucket(live.url)
        reply = retry_tenacity.create_chat_completion(client, model=MODEL_NAME, messages=USER, max_tokens=4)
        assert reply.attempts == 2
        assert 0.3 <= reply.waits[0] <= 1.1  # the server's retry-after-ms (at most 1 s at 60 rpm), not a guess
        assert reply.completion.usage.completion_tokens == 4
        assert not reply.is_replayed
        with pytest.raises(openai.BadRequestError):  # not worth retrying: the SDK's own exception comes out
            retry_tenacity.create_chat_completion(client, model=MODEL_NAME, messages=USER, max_tokens=-1)
