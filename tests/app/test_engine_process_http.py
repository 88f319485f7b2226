"""A real `surge serve` with its engine in a child process (the default): streams, metrics, and
what happens when either process dies."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from scripts.harness.loopback import loopback
from scripts.harness.servers import ServerProcess, surge_server

ARGS = (
    *("--served-model-name", "m", "--max-num-seqs", "4", "--max-model-len", "512", "--shutdown-delay-seconds", "0"),
    *("--embedding-model", "tiny"),  # its default, which the tests' environment turns off
)
USER = [{"role": "user", "content": "hello"}]


def spawned_pids(server: ServerProcess) -> list[int]:
    """The server's spawned children, the earliest started first: the engine process (started
    before the server's own imports), then the embedding model's (multiprocessing's resource
    tracker is not one of them)."""
    pid = server.proc.pid
    children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    spawned = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(spawned) == 2, children
    # Field 22 of /proc/PID/stat: the start time (after the command, which may hold spaces).
    return sorted(spawned, key=lambda c: int(Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[19]))


def engine_pid(server: ServerProcess) -> int:
    return spawned_pids(server)[0]


def torch_mapped(pid: int) -> bool:
    """Whether the process has torch's C++ library loaded."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] == "Z"  # a zombie is gone for our purpose
    except FileNotFoundError:
        return True


def wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def metric(url: str, name: str) -> float:
    text = loopback().get(f"{url}/metrics").text
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_streams_and_metrics_cross_the_process_boundary(tiny_model_dir: Path, tmp_path: Path) -> None:
    with surge_server(tiny_model_dir, tmp_path / "surge.log", *ARGS, graceful_stop=False) as server:
        pid = engine_pid(server)
        assert pid != server.proc.pid
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model="m",
            messages=USER,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        plain = client.chat.completions.create(
            model="m", messages=USER, max_tokens=12, temperature=0, extra_headers={"Cache-Control": "no-cache"}
        )  # computed afresh, not the dedup cache's replay of the stream
        assert plain.choices[0].message.content == text  # greedy both times
        assert metric(server.url, "surge_time_to_first_token_seconds_count") == 2
        assert metric(server.url, "surge_generation_tokens_total") == 24
        assert metric(server.url, "surge_requests_running") == 0
        assert metric(server.url, "surge_requests_waiting") == 0
        # A grammar crosses the pipe as text and is compiled and enforced in the engine process.
        schema = {
            "type": "object",
            "properties": {"k": {"enum": ["a", "b"]}},
            "required": ["k"],
            "additionalProperties": False,
        }
        formatted = client.chat.completions.create(
            model="m",
            messages=USER,
            max_tokens=40,
            seed=1,
            response_format={"type": "json_schema", "json_schema": {"name": "k", "schema": schema}},
        )
        assert json.loads(formatted.choices[0].message.content or "")["k"] in ("a", "b")
        assert metric(server.url, "surge_grammar_mask_seconds_count") >= 1  # observed in the engine process
        embedded = httpx.post(f"{server.url}/v1/embeddings", json={"model": "tiny-embedding", "input": "hello"})
        assert len(embedded.json()["data"][0]["embedding"]) == 256
        # After chats, a grammar, an embedding and a scrape, torch is mapped in the engine and
        # embedding processes only: the server took their pickled tokenizers rather than
        # AutoTokenizer (which imports torch).
        children = spawned_pids(server)
        assert children[0] == pid
        assert not torch_mapped(server.proc.pid) and all(torch_mapped(child) for child in children)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        assert all(wait_gone(child) for child in children)


def test_a_killed_engine_process_fails_the_open_stream_and_liveness(tiny_model_dir: Path, tmp_path: Path) -> None:
    with surge_server(tiny_model_dir, tmp_path / "surge.log", *ARGS, graceful_stop=False) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model="m", messages=USER, max_tokens=400, stream=True, extra_body={"ignore_eos": True}
        )
        first = next(iter(stream))
        assert first.choices
        os.kill(engine_pid(server), signal.SIGKILL)
        with pytest.raises(openai.APIError, match="engine process exited"):
            for _ in stream:
                pass
        assert httpx.get(f"{server.url}/ready").status_code == 503
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "engine dead"
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model="m", messages=USER, max_tokens=2)
        assert refused.value.status_code == 503
        assert "engine process exited" in server.log()


def test_the_engine_process_exits_when_the_server_is_killed(tiny_model_dir: Path, tmp_path: Path) -> None:
    with surge_server(tiny_model_dir, tmp_path / "surge.log", *ARGS, graceful_stop=False) as server:
        children = spawned_pids(server)
        server.proc.kill()  # no chance to stop the children: they see their pipes close
        server.proc.wait()
        assert all(wait_gone(child) for child in children), "a child process outlived the server"


def test_a_killed_embedding_process_is_a_503_and_fails_liveness(tiny_model_dir: Path, tmp_path: Path) -> None:
    with surge_server(tiny_model_dir, tmp_path / "surge.log", *ARGS, graceful_stop=False) as server:
        body = {"model": "tiny-embedding", "input": "hello"}
        assert httpx.post(f"{server.url}/v1/embeddings", json=body).status_code == 200
        embedding = spawned_pids(server)[1]
        os.kill(embedding, signal.SIGKILL)
        assert wait_gone(embedding)
        refused = httpx.post(f"{server.url}/v1/embeddings", json=body)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "service_unavailable"
        assert httpx.get(f"{server.url}/health").status_code == 503
        # The chat model still answers (the pod's restart is the probe's call, not this request's).
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        assert client.chat.completions.create(model="m", messages=USER, max_tokens=2).choices
