"""SIGTERM under load, as Kubernetes sends it: refuse new work politely, finish accepted work, exit 0.

Under load means a full batch and a queue: streams decoding, and streams and JSON requests still
waiting for a slot when the signal comes. Every one of them was accepted, so every one must end
whole within the grace period.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from scripts.harness.loopback import loopback
from scripts.harness.servers import surge_server

NUM_STREAMS = 6
MAX_NUM_SEQS = 4  # so NUM_STREAMS - MAX_NUM_SEQS streams and every JSON request are queued at SIGTERM
NUM_JSON = 2
# Long enough that the streams outlive the drain window: about 3 s for 6 streams on the `s` model.
MAX_TOKENS = 1000
# The requests queued at SIGTERM need only be accepted before it and run whole after it: at
# MAX_TOKENS they were a second 1000-token wave behind the first, about half of the test's 29 s on CI.
QUEUED_MAX_TOKENS = 64
DELAY_S = 1.0
GRACE_S = 60.0


@dataclass
class Stream:
    max_tokens: int = MAX_TOKENS
    started: threading.Event = field(default_factory=threading.Event)
    is_done: bool = False
    status: int = 0
    saw_done: bool = False
    completion_tokens: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    error: BaseException | None = None

    def run(self, url: str) -> None:
        body = {
            "model": "m",
            "prompt": "once upon a time",
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=GRACE_S) as reply:
                self.status = reply.status_code
                for line in reply.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    self.started.set()
                    if line == "data: [DONE]":
                        self.saw_done = True
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    self.finish_reasons += [c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]]
                    if chunk.get("usage"):
                        self.completion_tokens = chunk["usage"]["completion_tokens"]
        except BaseException as exc:
            self.error = exc
        finally:
            self.is_done = True
            self.started.set()


@dataclass
class Plain:
    """A JSON (non-streamed) request, queued behind the streams."""

    status: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    error: BaseException | None = None

    def run(self, url: str) -> None:
        body = {"model": "m", "prompt": "queued", "max_tokens": QUEUED_MAX_TOKENS, "ignore_eos": True}
        try:
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=GRACE_S)
            self.status = reply.status_code
            self.completion_tokens = reply.json()["usage"]["completion_tokens"]
            self.finish_reason = reply.json()["choices"][0]["finish_reason"]
        except BaseException as exc:
            self.error = exc


def gauge(url: str, name: str) -> float:
    match = re.search(rf"^{name}{{[^}}]*}} (\S+)$", loopback().get(f"{url}/metrics").text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_sigterm_under_load_refuses_new_requests_and_finishes_every_accepted_stream(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ("--served-model-name", "m", "--max-model-len", "2048", "--max-num-seqs", str(MAX_NUM_SEQS))
    shutdown = ("--shutdown-delay-seconds", str(DELAY_S), "--shutdown-grace-seconds", str(GRACE_S))
    with surge_server(tiny_model_dir, tmp_path / "surge.log", *args, *shutdown, graceful_stop=False) as server:
        streams = [Stream() for _ in range(MAX_NUM_SEQS)]
        streams += [Stream(max_tokens=QUEUED_MAX_TOKENS) for _ in range(NUM_STREAMS - MAX_NUM_SEQS)]
        plains = [Plain() for _ in range(NUM_JSON)]
        threads = [threading.Thread(target=s.run, args=(server.url,)) for s in streams]
        threads += [threading.Thread(target=p.run, args=(server.url,)) for p in plains]
        for thread in threads[:MAX_NUM_SEQS]:
            thread.start()
        for stream in streams[:MAX_NUM_SEQS]:
            assert stream.started.wait(30)
        for thread in threads[MAX_NUM_SEQS:]:  # the rest queue (a completions stream is silent until it runs)
            thread.start()
        # Accepted, and a full batch with a queue behind it.
        deadline = time.monotonic() + 30
        while gauge(server.url, "surge_requests_waiting") < NUM_STREAMS - MAX_NUM_SEQS + NUM_JSON:
            assert time.monotonic() < deadline, "the queued requests never reached the server"
            time.sleep(0.02)
        assert gauge(server.url, "surge_requests_running") == MAX_NUM_SEQS
        assert not any(s.is_done for s in streams), "streams ended before SIGTERM: make them longer"

        server.proc.send_signal(signal.SIGTERM)
        server.wait_for_log("SIGTERM: not ready")

        # The drain window: still accepting connections, but not ready and refusing new work.
        ready = httpx.get(f"{server.url}/ready")
        assert ready.status_code == 503
        assert "Retry-After" in ready.headers
        body = {"model": "m", "prompt": "new", "max_tokens": 4}
        refused = httpx.post(f"{server.url}/v1/completions", json=body)
        assert refused.status_code == 503
        assert int(refused.headers["Retry-After"]) > 0
        assert refused.headers["Connection"] == "close"
        assert refused.json()["error"]["type"] == "server_error"

        # After the window the listener is closed, while accepted streams still run.
        server.wait_for_log("closing the listener")
        deadline = time.monotonic() + 10  # uvicorn closes it on its next turn, right after the line
        while not all(s.is_done for s in streams):
            try:
                loopback().get(f"{server.url}/health", timeout=2)
            except httpx.ConnectError:
                break
            assert time.monotonic() < deadline, "the listener is still open after the drain window"
            time.sleep(0.02)

        for thread in threads:
            thread.join(GRACE_S)
        for stream in streams:
            assert stream.error is None, repr(stream.error)
            assert stream.status == 200
            assert stream.saw_done, "a stream was cut short"
            assert stream.completion_tokens == stream.max_tokens
            assert stream.finish_reasons == ["length"]
        for plain in plains:  # queued at SIGTERM, run after it
            assert plain.error is None, repr(plain.error)
            assert (plain.status, plain.completion_tokens, plain.finish_reason) == (200, QUEUED_MAX_TOKENS, "length")

        assert server.proc.wait(timeout=GRACE_S) == 0
        log = server.log()
        assert "SIGTERM: not ready" in log
        assert "closing the listener" in log


def test_a_second_sigterm_forces_the_exit(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = ("--served-model-name", "m", "--max-model-len", "2048", "--shutdown-delay-seconds", "30")
    with surge_server(tiny_model_dir, tmp_path / "surge.log", *args, graceful_stop=False) as server:
        server.proc.send_signal(signal.SIGTERM)
        server.wait_for_log("SIGTERM: not ready")
        assert server.proc.poll() is None  # draining: the delay is 30 s
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=10) != 0
        assert "second SIGTERM" in server.log()
