"""Clients that open a stream and never read it: bounded memory, and nobody else slows down.

Each stalled client is a raw socket with a small receive buffer that sends a streaming request
and then never reads. Its answer is large (two choices with 20 top logprobs per token, about
5 MB of SSE), well past what the kernel's socket buffers absorb (about 3 MB on loopback), so
uvicorn has to stop writing to it and hold the rest. The server runs `--model echo` (no forward
pass: tokens cost only the serving path), so the test is about the serving side and is quick.

Pass criteria: the engine does not wait for such readers (their sequences run to the end and
free their slots while the clients hold on); the server's resident memory (VmRSS of the `surge
serve` process) grows by at most a few times what the stalled clients did not read, and stops
growing while they wait; normal streams beside them run to their end; once they hang up, their
responses end and the server serves as before. That the normal streams keep their speed (tokens/s
with the stalled clients attached over tokens/s without, at least MIN_SPEED_RATIO) is the
reliability run's criterion (`pytest -m reliability`): `make test` holds no speed bound.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from scripts.harness.procs import rss_bytes
from scripts.harness.servers import ServerProcess, surge_servers
from tests.app.fault_tools import metric, wait_idle

# Judged under load: on the machine alone, not beside a second test worker (Makefile).
pytestmark = pytest.mark.serial

CHAT = "/v1/chat/completions"
# Degradation off: a wave of stalled clients queued behind a full batch would (rightly) raise the
# level, and level 3 answers normal streams with canned replies; this test is about slow readers.
# The send timeout off: the stalled clients must hold on for the whole test (cutting them is
# tests/app/runtime/test_connections.py's).
ARGS = (
    "--served-model-name", "m", "--max-model-len", "2048", "--max-num-seqs", "16",
    "--degrade-thresholds", "off", "--log-level", "warning", "--send-timeout-seconds", "0",
)  # fmt: skip
RECEIVE_BUFFER = 4096  # bytes: the stalled client's kernel buffer
STALLED_TOKENS = 2000
# Two choices with 20 alternatives per token: about 2.6 KB of SSE per token, 5 MB per answer.
STALLED_BODY = {"n": 2, "logprobs": True, "top_logprobs": 20, "max_tokens": STALLED_TOKENS}
NORMAL_STREAMS, NORMAL_TOKENS = 4, 1000
# Normal streams with stalled clients attached, against without. What it guards against is a
# server that stalls with them (an event loop busy on their writes, slots they hold): that costs
# far more than half. Healthy runs measure 0.83-1.19 here, and 0.58 once in CI (4,047 tok/s
# alone, the fastest round seen, against 2,337 beside): the box's own noise, hence 0.5.
MIN_SPEED_RATIO = 0.5
# Each side's speed is the best of this many rounds: one round on a shared 2-core box varies 2.5x
# (1400 to 3500 tok/s seen for the same server alone), the best of five far less.
SPEED_ROUNDS = 5
# Memory the server may keep per unread byte (engine outputs are Python objects, larger than
# their SSE), and a fixed allowance for connections and the allocator's own growth.
MAX_MEMORY_PER_UNREAD_BYTE = 4
FIXED_ALLOWANCE = 64 * 1024 * 1024
PLATEAU_BYTES = 8 * 1024 * 1024  # growth allowed between two samples once the stalled streams are done


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with surge_servers("echo", tmp_path_factory.mktemp("slow-clients"), ARGS, graceful_stop=False) as (server,):
        yield server


def stalled_body() -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "I will not read this"}],
        "ignore_eos": True,
        "stream": True,
        **STALLED_BODY,
    }


def stall(url: str) -> socket.socket:
    """Send a streaming request and never read the answer; the socket is returned to be closed later."""
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)  # before connect: sets the window
    sock.connect((parts.hostname, parts.port))
    body = json.dumps(stalled_body()).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def normal_streams_speed(url: str, rounds: int) -> float:
    """The best of `rounds` rounds of normal_streams_round."""
    return max(normal_streams_round(url) for _ in range(rounds))


def normal_streams_round(url: str) -> float:
    """Median tokens/s of NORMAL_STREAMS concurrent streams read as fast as they come."""
    speeds: list[float] = []
    errors: list[BaseException] = []

    def one() -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "normal"}], "max_tokens": NORMAL_TOKENS}
        body |= {"ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "temperature": 1.0}
        try:
            with httpx.stream("POST", f"{url}{CHAT}", json=body, timeout=60) as reply:
                assert reply.status_code == 200
                first = last = 0.0
                num_tokens = 0
                for line in reply.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line.removeprefix("data: "))
                        if chunk.get("usage"):
                            num_tokens = chunk["usage"]["completion_tokens"]
                        elif chunk["choices"] and chunk["choices"][0]["delta"].get("content") is not None:
                            first, last = first or time.monotonic(), time.monotonic()
            assert num_tokens == NORMAL_TOKENS
            speeds.append(num_tokens / (last - first))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(NORMAL_STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return statistics.median(speeds)


def answer_bytes(url: str) -> int:
    """The size of one stalled client's answer, read in full by a normal client."""
    with httpx.stream("POST", f"{url}{CHAT}", json=stalled_body(), timeout=60) as reply:
        return sum(len(chunk) for chunk in reply.iter_raw())


@pytest.mark.parametrize(
    ("num_stalled", "speed"),
    [pytest.param(8, False, id="8"), pytest.param(32, True, id="32", marks=pytest.mark.reliability)],
)
def test_stalled_readers_keep_memory_bounded_and_others_going(
    server: ServerProcess, num_stalled: int, speed: bool
) -> None:
    pid = server.proc.pid
    # Where speed is not judged, one round: the normal streams still run beside the stalled ones
    # and must all complete, and make test saves the other eight (about 15 s on 2 cores).
    rounds = SPEED_ROUNDS if speed else 1
    size = answer_bytes(server.url)  # also warms the paths
    wait_idle(server.url)
    rss_before = rss_bytes(pid)
    speed_before = normal_streams_speed(server.url, rounds)
    aborted = metric(server.url, "surge_requests_aborted_total")
    answered = metric(server.url, "http_requests_total", handler=CHAT)  # counted once a response has ended
    generated = metric(server.url, "surge_generation_tokens_total")

    stalled = [stall(server.url) for _ in range(num_stalled)]
    try:
        # The engine does not wait for readers: every stalled sequence runs to its end and frees its slot.
        deadline = time.monotonic() + 120
        expected = generated + num_stalled * STALLED_BODY["n"] * STALLED_TOKENS
        while metric(server.url, "surge_generation_tokens_total") < expected:
            assert time.monotonic() < deadline, "the stalled clients' sequences never finished"
            time.sleep(0.1)
        wait_idle(server.url)
        rss_done = rss_bytes(pid)
        time.sleep(1.0)
        rss_later = rss_bytes(pid)
        speed_with = normal_streams_speed(server.url, rounds)
        rss_with = rss_bytes(pid)
        # A normal response is counted once its handler has returned, a moment after its client
        # read the last byte (a loaded CI machine once counted 1 of 4 by then): wait for them.
        want = answered + rounds * NORMAL_STREAMS
        deadline = time.monotonic() + 10
        while (count := metric(server.url, "http_requests_total", handler=CHAT)) < want:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        # And no more: the stalled ones are still holding on, their responses have not ended
        # (uvicorn holds what they did not read).
        assert count == want
    finally:
        for sock in stalled:
            sock.close()

    grown = max(rss_done, rss_later, rss_with) - rss_before
    budget = num_stalled * size * MAX_MEMORY_PER_UNREAD_BYTE + FIXED_ALLOWANCE
    print(
        f"\n{num_stalled} stalled clients, {size / 2**20:.1f} MiB of answer each: server RSS "
        f"{rss_before / 2**20:.1f} MiB before, +{(rss_done - rss_before) / 2**20:.1f} MiB once generated, "
        f"+{(rss_later - rss_before) / 2**20:.1f} MiB 1 s later, +{(rss_with - rss_before) / 2**20:.1f} MiB "
        f"after the normal streams (budget {budget / 2**20:.0f} MiB); normal streams {speed_before:.0f} tok/s "
        f"alone, {speed_with:.0f} tok/s beside them (ratio {speed_with / speed_before:.2f})"
    )
    assert grown <= budget
    assert rss_later - rss_done <= PLATEAU_BYTES, "memory still growing while the stalled clients wait"
    if speed:
        assert speed_with >= MIN_SPEED_RATIO * speed_before

    # Once they hang up, their responses end, nothing of them is left and the server serves as before.
    deadline = time.monotonic() + 15
    while metric(server.url, "http_requests_total", handler=CHAT) < answered + rounds * NORMAL_STREAMS + num_stalled:
        assert time.monotonic() < deadline, "the responses of clients that hung up never ended"
        time.sleep(0.1)
    wait_idle(server.url)
    assert metric(server.url, "surge_requests_aborted_total") == aborted  # they finished; nothing to abort
    body = {"model": "m", "messages": [{"role": "user", "content": "after"}], "max_tokens": 8, "ignore_eos": True}
    reply = httpx.post(f"{server.url}{CHAT}", json=body, timeout=30)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8
