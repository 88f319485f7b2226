"""Connection bounds of `surge serve` (app/server/http_protocol.py, app/runtime/connections.py): header size, header
and body time, connections per address and in all, and clients that stop reading."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.runtime.connections import PROBE_RESERVE, Connections, Phase
from scripts.harness.servers import ServerProcess, surge_argv, surge_server
from tests.app.fault_tools import metric, wait_idle

# The crowded server's bounds: small, so a test reaches them with a few sockets.
MAX_CONNECTIONS, PER_ADDRESS = 8, 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    bounds = ("--max-header-bytes", "4096", "--header-timeout-seconds", "2", "--body-timeout-seconds", "2")
    argv = surge_argv("echo", *bounds)
    process = ServerProcess("surge", argv, tmp_path_factory.mktemp("conn") / "surge.log")
    process.start()
    try:
        yield process
    finally:
        process.stop(graceful=False)  # its shutdown is test_shutdown.py's; a graceful one paid a 2 s drain delay


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def reply(sock: socket.socket) -> bytes:
    try:
        return sock.recv(4096)
    except (ConnectionResetError, TimeoutError):
        return b""


def assert_trickle_is_cut_off(server: ServerProcess, start: bytes, byte: bytes) -> None:
    """Send `start`, then `byte` every 0.2 s: the server must close the connection, unanswered,
    within 6 s (its deadlines here are 2 s)."""
    with connect(server) as sock:
        sock.sendall(start)
        started = time.monotonic()
        while time.monotonic() - started < 6:
            try:
                sock.sendall(byte)
            except OSError:
                break  # closed by the server
            time.sleep(0.2)
        assert reply(sock) == b""  # closed, never answered
    assert time.monotonic() - started < 6, "the connection was never closed"


def test_headers_over_the_bound_are_a_400(server: ServerProcess) -> None:
    """The attack: httptools took request headers of any size (a 1 MB header was accepted)."""
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192 + b"\r\n\r\n")
        assert reply(sock).startswith(b"HTTP/1.1 400")
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Small: " + b"a" * 1000 + b"\r\n\r\n")
        assert reply(sock).startswith(b"HTTP/1.1 200")


def test_headers_that_trickle_past_the_deadline_lose_their_connection(server: ServerProcess) -> None:
    """The attack (slowloris): headers sent a byte at a time held a connection forever."""
    assert_trickle_is_cut_off(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"a")


def test_a_body_that_trickles_past_its_deadline_loses_its_connection(server: ServerProcess) -> None:
    """The attack: headers on time, then a body sent a byte at a time, held the connection (and
    the request's place in the app) for as long as the client liked."""
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    assert_trickle_is_cut_off(server, head + b'{"model": ', b" ")
    body = b'{"model": "echo", "prompt": "hi", "max_tokens": 2}'
    with connect(server) as sock:  # a body sent at once is not affected
        sock.sendall(head.replace(b"1000", str(len(body)).encode()) + body)
        assert reply(sock).startswith(b"HTTP/1.1 200")


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Small connection bounds, and a header deadline long enough that half-sent requests outlast a test."""
    bounds = ("--max-connections", str(MAX_CONNECTIONS), "--max-connections-per-address", str(PER_ADDRESS))
    argv = surge_argv("echo", *bounds, "--header-timeout-seconds", "120", "--log-level", "warning")
    process = ServerProcess("surge", argv, tmp_path_factory.mktemp("crowded") / "surge.log")
    process.start()
    try:
        yield process
    finally:
        process.stop(graceful=False)


def connect_from(server: ServerProcess, address: str) -> socket.socket:
    """A connection from `address`: every 127.x.y.z is loopback, so each is a client address of its own."""
    return socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=(address, 0))


def get(sock: socket.socket, path: str) -> bytes:
    """One whole response to GET `path` (head and body), or b"" when the server closed the connection."""
    try:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            reply += chunk
        length = re.search(rb"(?im)^content-length: *(\d+)", reply)
        while length is not None and len(reply.partition(b"\r\n\r\n")[2]) < int(length.group(1)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        return reply
    except OSError:  # reset, or a write after the server closed it
        return b""


def idle_connection(server: ServerProcess, address: str) -> socket.socket:
    """A keep-alive connection from `address` that has had one answer and now sends nothing."""
    sock = connect_from(server, address)
    get(sock, "/health")
    return sock


def half_sent(server: ServerProcess, address: str) -> socket.socket:
    """A connection from `address` whose request headers never end (slowloris)."""
    sock = connect_from(server, address)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


def is_closed(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (read without consuming anything)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.settimeout(10)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def wait_for_busy(server: ServerProcess, num_busy: int) -> None:
    """Until the server holds `num_busy` connections mid-request and none idle (the scrape's own counts too)."""
    wait_until(
        lambda: (
            metric(server.url, "surge_connections_open") >= num_busy + 1
            and metric(server.url, "surge_connections_idle") == 0
        ),
        f"{num_busy} connections mid-request",
    )


def close_all(socks: list[socket.socket], server: ServerProcess) -> None:
    for sock in socks:
        sock.close()
    wait_until(lambda: metric(server.url, "surge_connections_open") <= 1, "the closed connections are gone")


def test_idle_connections_from_one_address_cannot_lock_out_others_or_the_probes(crowded: ServerProcess) -> None:
    """The attack: uvicorn's `limit_concurrency` counted idle keep-alive connections; 2,048 of them (the
    default --max-connections) from one address made every request a 503, `/health` and `/ready` too, and
    the kubelet restarted the pod. Here an address past its share loses its own longest-idle connections,
    and past the server's bound the longest-idle ones of all go: new clients and the probes get in."""
    hoard = [idle_connection(crowded, "127.0.0.2") for _ in range(3 * MAX_CONNECTIONS)]
    others = [idle_connection(crowded, f"127.0.0.{i}") for i in range(3, 6) for _ in range(PER_ADDRESS)]
    try:
        for path in ("/v1/models", "/health", "/ready"):
            with connect_from(crowded, "127.0.0.9") as sock:
                assert get(sock, path).startswith(b"HTTP/1.1 200"), path
        wait_until(lambda: sum(not is_closed(s) for s in hoard) <= PER_ADDRESS, "one address keeps its share")
        wait_until(lambda: sum(not is_closed(s) for s in hoard + others) <= MAX_CONNECTIONS, "the bound holds")
        assert all(is_closed(s) for s in hoard[:-PER_ADDRESS]), "the longest idle go first"
    finally:
        close_all(hoard + others, crowded)


def test_connections_all_mid_request_still_leave_the_probes_room(crowded: ServerProcess) -> None:
    """Past --max-connections with none idle (every one mid-request here), a few more connections are
    let in for the probes: `/health`, `/ready` and `/metrics` are answered, anything else gets a 503 in
    OpenAI's error shape and the connection closes."""
    busy = [half_sent(crowded, f"127.0.0.{2 + i // PER_ADDRESS}") for i in range(MAX_CONNECTIONS)]
    try:
        wait_for_busy(crowded, MAX_CONNECTIONS)
        with connect_from(crowded, "127.0.0.9") as sock:
            refused = get(sock, "/v1/models")
        assert refused.startswith(b"HTTP/1.1 503") and b'"too_many_connections"' in refused, refused
        for path in ("/health", "/ready", "/metrics"):
            with connect_from(crowded, "127.0.0.9") as sock:
                assert get(sock, path).startswith(b"HTTP/1.1 200"), path
    finally:
        close_all(busy, crowded)
    with connect_from(crowded, "127.0.0.9") as sock:
        assert get(sock, "/v1/models").startswith(b"HTTP/1.1 200")


def test_an_address_whose_requests_all_trickle_gets_no_more_connections(crowded: ServerProcess) -> None:
    """Slowloris from one address: headers that trickle are no idle connection to close, so past
    --max-connections-per-address that address's new connections are closed at once; others are served."""
    slow = [half_sent(crowded, "127.0.0.2") for _ in range(PER_ADDRESS)]
    try:
        wait_for_busy(crowded, PER_ADDRESS)
        with connect_from(crowded, "127.0.0.2") as sock:
            assert get(sock, "/health") == b""  # closed, unanswered
        with connect_from(crowded, "127.0.0.3") as sock:
            assert get(sock, "/health").startswith(b"HTTP/1.1 200")
        assert metric(crowded.url, "surge_connections_closed_total", reason="per_address") >= 1
    finally:
        close_all(slow, crowded)


# A stream far larger than what the kernel's socket buffers take on loopback (about 3 MB): six
# choices of 2,000 tokens with 20 alternatives each, about 21 MB of SSE, some 20 s of the tiny
# model on 2 cores; the sends block after the first ~15%.
STALLED_CHOICES = 6
STALLED_BODY = {
    "n": STALLED_CHOICES,
    "max_tokens": 2000,
    "logprobs": True,
    "top_logprobs": 20,
    "ignore_eos": True,
    "stream": True,
}


def test_a_stream_nobody_reads_is_cut_and_its_slot_freed(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The attack: a streaming request whose client never reads. Once the socket's buffers were full,
    uvicorn waited for the client forever: the connection, the unsent response and, while the
    generation ran, its engine slots stayed taken. Now past --send-timeout-seconds the connection is
    cut, and the disconnect aborts the request in the engine."""
    args = ("--send-timeout-seconds", "1", "--degrade-thresholds", "off", "--log-level", "warning")
    with surge_server(tiny_model_dir, tmp_path / "surge.log", *args, graceful_stop=False) as server:
        aborted = metric(server.url, "surge_requests_aborted_total")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: sets the window
        sock.settimeout(10)
        messages = [{"role": "user", "content": "never read"}]
        body = json.dumps({"model": str(tiny_model_dir), "messages": messages, **STALLED_BODY})
        with sock:
            sock.connect(("127.0.0.1", server.port))
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body.encode())
            # Every sequence aborted, long before the generation would have ended.
            num_choices = STALLED_CHOICES
            wait_until(
                lambda: metric(server.url, "surge_requests_aborted_total") >= aborted + num_choices,
                "the unread stream's sequences aborted",
                timeout=60,
            )
            wait_idle(server.url)
            assert metric(server.url, "surge_connections_closed_total", reason="send_timeout") == 1
            received = bytearray()
            try:
                while chunk := sock.recv(1 << 20):
                    received += chunk
            except ConnectionResetError:
                pass
        assert received.startswith(b"HTTP/1.1 200") and b"data: [DONE]" not in received  # cut mid-stream


# --- the registry alone (app/runtime/connections.py) -------------------------------------------------------


@dataclass(eq=False)
class FakeConnection:
    address: str
    is_closed: bool = False

    def close_now(self) -> None:
        self.is_closed = True


def test_an_address_at_its_share_loses_its_longest_idle_connection_not_the_new_one() -> None:
    connections = Connections(0, 2)
    first, second = FakeConnection("a"), FakeConnection("a")
    assert connections.admit(first) and connections.admit(second)
    other = FakeConnection("b")
    assert connections.admit(other) and not first.is_closed  # another address has its own share
    third = FakeConnection("a")
    assert connections.admit(third)
    assert first.is_closed and not second.is_closed and connections.num_evicted == 1


def test_an_address_with_nothing_idle_gets_no_more_but_requests_being_answered_do_not_count() -> None:
    connections = Connections(0, 2)
    held = [FakeConnection("a"), FakeConnection("a")]
    for connection in held:
        assert connections.admit(connection)
        connections.set_phase(connection, Phase.RECEIVING)
    assert not connections.admit(FakeConnection("a")) and connections.num_refused_address == 1
    connections.set_phase(held[0], Phase.SERVING)  # its request arrived: the server's work now
    assert connections.admit(FakeConnection("a"))


def test_past_the_bound_the_longest_idle_of_any_address_goes() -> None:
    connections = Connections(2, 0)
    old, busy = FakeConnection("a"), FakeConnection("b")
    assert connections.admit(old) and connections.admit(busy)
    connections.set_phase(busy, Phase.SERVING)
    connections.set_phase(old, Phase.SERVING)
    connections.set_phase(old, Phase.IDLE)  # idle again: the longest idle, and the only one
    assert connections.admit(FakeConnection("c"))
    assert old.is_closed and not busy.is_closed and connections.num_open == 2


def test_with_nothing_idle_a_reserve_of_connections_serves_probes_only() -> None:
    connections = Connections(1, 0)
    busy = FakeConnection("a")
    assert connections.admit(busy)
    connections.set_phase(busy, Phase.SERVING)
    extra = [FakeConnection("b") for _ in range(PROBE_RESERVE)]
    for connection in extra:  # each sends a request at once: none stays idle
        assert connections.admit(connection)
        connections.set_phase(connection, Phase.RECEIVING)
    assert not connections.admit(FakeConnection("c")) and connections.num_refused_full == 1
    assert connections.may_serve("/health") and connections.may_serve("/ready") and connections.may_serve("/metrics")
    assert not connections.may_serve("/v1/chat/completions") and connections.num_over_limit == 1
    for connection in extra:
        connections.remove(connection)
        connections.remove(connection)  # idempotent
    assert connections.may_serve("/v1/chat/completions") and connections.num_open == 1


def test_a_request_past_the_bound_closes_an_idle_connection_rather_than_being_refused() -> None:
    connections = Connections(1, 0)
    busy, idle = FakeConnection("a"), FakeConnection("b")
    assert connections.admit(busy) and connections.admit(idle)  # busy is idle when idle arrives: it goes
    assert busy.is_closed
    connections.set_phase(busy, Phase.RECEIVING)  # a closed connection's late report is ignored
    assert connections.num_open == 1 and connections.num_idle == 1
    late = FakeConnection("c")
    connections.set_phase(idle, Phase.RECEIVING)
    assert connections.admit(late)  # nothing idle: into the reserve
    connections.set_phase(late, Phase.IDLE)
    assert connections.may_serve("/v1/models") and late.is_closed  # the idle one made room
