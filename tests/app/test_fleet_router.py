"""Two surge replicas behind a real router, `vllm-router` from PyPI (a Rust binary), sharing one
Redis: prefix-aware routing lands a conversation's later turns on the replica that holds its
prefix (the replicas' own cache-hit counts prove it, against round-robin on the same run), by
the KV events (`kv_aware`), by the router's own prefix tree (`cache_aware`) or by session
(`consistent_hash` on `X-Session-ID`); per-key rate limits and idempotency keys hold across
both replicas whichever one a request reaches.

Needs the `vllm-router` executable (the dev extra installs it); without it the tests skip.
"""

from __future__ import annotations

import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.harness.ports import free_port
from scripts.harness.servers import ServerProcess, start_surge

# Installed beside this Python (the venv's bin, which need not be on PATH), else anywhere on PATH.
_BESIDE = Path(sys.executable).parent / "vllm-router"
ROUTER = str(_BESIDE) if _BESIDE.exists() else shutil.which("vllm-router")
MODEL = "tiny"
KEY = "sk-fleet-router-tenant-01"
LIMITED_KEY = "sk-fleet-router-limited-02"
SYSTEM = "You are a lighthouse keeper who answers in riddles about the tides, the wind and the stars. " * 8
NUM_CONVERSATIONS, NUM_TURNS = 8, 3
RPM = 40

pytestmark = pytest.mark.skipif(ROUTER is None, reason="vllm-router is not installed (pip install vllm-router)")


class Fleet:
    def __init__(self, replicas: list[ServerProcess], events: list[str], log_dir: Path) -> None:
        self.replicas = replicas
        self.events = events  # each replica's KV events address, for the router to connect to
        self.log_dir = log_dir

    def router(self, policy: str, *extra: str) -> ServerProcess:
        urls = [replica.url for replica in self.replicas]
        argv = [str(ROUTER), "--host", "127.0.0.1", "--port", "{port}", "--policy", policy, "--worker-urls", *urls]
        argv += ["--prometheus-port", str(free_port()), "--log-level", "info", *extra]
        router = ServerProcess(f"router-{policy}", argv, self.log_dir / f"router-{policy}.log", ready_path="/health")
        router.start()
        return router


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    log_dir = tmp_path_factory.mktemp("fleet")
    ports = [free_port(), free_port()]
    common = ["--served-model-name", MODEL, "--max-model-len", "2048", "--redis-url", redis_server.url]
    keys = log_dir / "keys.yaml"
    keys.write_text(f"{KEY}:\n{LIMITED_KEY}: {{rpm: {RPM}}}\n")
    common += ["--keys-file", str(keys), "--kv-events-format", "array-map"]
    replicas = [
        start_surge(tiny_model_dir, log_dir / f"surge-{i}.log", *common, "--kv-events-endpoint", f"tcp://*:{port}")
        for i, port in enumerate(ports)
    ]
    try:
        for replica in replicas:
            replica.wait_ready()
        yield Fleet(replicas, [f"tcp://127.0.0.1:{port}" for port in ports], log_dir)
    finally:
        for replica in replicas:
            replica.stop(graceful=False)


def converse(router: ServerProcess, session_header: bool = False) -> list[tuple[int, int, int]]:
    """NUM_CONVERSATIONS conversations side by side, NUM_TURNS turns each, every turn sending the
    whole history; (turn, prompt tokens, cached tokens) of every reply."""
    tag = uuid.uuid4().hex[:8]

    def one(index: int) -> list[tuple[int, int, int]]:
        session = f"{tag}-{index}"
        messages: list[dict[str, str]] = [{"role": "system", "content": f"[{session}] {SYSTEM}"}]
        headers = {"authorization": f"Bearer {KEY}"} | ({"x-session-id": session} if session_header else {})
        turns = []
        with httpx.Client(base_url=router.url, headers=headers, timeout=60) as client:
            for turn in range(1, NUM_TURNS + 1):
                messages.append({"role": "user", "content": f"Question {turn} of {session}?"})
                body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
                reply = client.post("/v1/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
                answer = reply.json()
                usage = answer["usage"]
                turns.append((turn, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
                messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"] or ""})
        return turns

    with ThreadPoolExecutor(NUM_CONVERSATIONS) as pool:
        return [turn for turns in pool.map(one, range(NUM_CONVERSATIONS)) for turn in turns]


def running(replica: ServerProcess) -> float:
    scrape = httpx.get(f"{replica.url}/metrics", headers={"authorization": "Bearer m"}, timeout=10).text
    line = next(line for line in scrape.splitlines() if line.startswith("vllm:num_requests_running{"))
    return float(line.rsplit(" ", 1)[1])


def later_hit_share(turns: list[tuple[int, int, int]]) -> float:
    later = [(prompt, cached) for turn, prompt, cached in turns if turn > 1]
    return sum(cached for _, cached in later) / sum(prompt for prompt, _ in later)


def test_prefix_aware_routing_lands_later_turns_where_their_prefix_is(fleet: Fleet) -> None:
    sources = [f"{replica.url}={events}" for replica, events in zip(fleet.replicas, fleet.events, strict=True)]
    kv = ["--kv-event-model", MODEL, "--kv-event-block-size", "16"]
    for source in sources:
        kv += ["--kv-event-source", source]
    shares: dict[str, float] = {}
    for policy, extra, by_session in (
        ("round_robin", [], False),
        ("kv_aware", kv, False),
        ("cache_aware", [], False),
        ("consistent_hash", [], True),
    ):
        router = fleet.router(policy, *extra)
        try:
            shares[policy] = later_hit_share(converse(router, session_header=by_session))
        finally:
            router.stop()
    print(f"later turns' prompt tokens from the prefix cache: {shares}")
    # Later turns resend a history of ~300 tokens: where it is cached, all but its last, partial
    # block hits (~0.9); round-robin sends half of them to the replica without it (~0.55). kv_aware
    # weighs the prefix against the replicas' load and sometimes picks the idler one (0.74-0.91
    # seen); without the events it would fall back to the least loaded replica, round-robin's share.
    for policy in ("cache_aware", "consistent_hash"):
        assert shares[policy] > 0.8 and shares[policy] > shares["round_robin"] + 0.2, shares
    assert shares["kv_aware"] > 0.65 and shares["kv_aware"] > shares["round_robin"] + 0.1, shares


def test_per_key_limits_and_idempotency_hold_across_the_replicas(fleet: Fleet) -> None:
    router = fleet.router("round_robin")
    try:
        headers = {"authorization": f"Bearer {LIMITED_KEY}"}
        with httpx.Client(base_url=router.url, headers=headers, timeout=60) as client:
            key = f"idem-{uuid.uuid4().hex}"
            body = {"model": MODEL, "messages": [{"role": "user", "content": "Once."}], "max_tokens": 3}
            first = client.post("/v1/chat/completions", json=body, headers={"idempotency-key": key})
            again = client.post(
                "/v1/chat/completions", json=body, headers={"idempotency-key": key}
            )  # the other replica
            assert first.status_code == again.status_code == 200
            assert again.headers.get("idempotent-replayed") == "true" and again.json() == first.json()
            statuses = [
                client.post("/v1/chat/completions", json={**body, "max_tokens": 1}).status_code for _ in range(RPM + 5)
            ]
        # One key's requests per minute across both replicas (Redis), not per replica: at most RPM succeed.
        assert statuses.count(429) >= 5 and statuses.count(200) <= RPM, statuses
    finally:
        router.stop()


def test_a_replica_killed_mid_run_loses_no_request_its_client_retries(
    tiny_model_dir: Path, redis_server: Any, tmp_path: Path
) -> None:
    """Requests in flight on a replica that dies (SIGKILL) fail at the router; each client retries
    with its Idempotency-Key until it has an answer, which the live replica gives once the dead
    one's lease on the key runs out. Every request ends answered, and every retry of a key that
    had completed is that answer replayed."""
    common = ["--served-model-name", MODEL, "--max-model-len", "2048", "--redis-url", redis_server.url]
    common += ["--api-key", KEY, "--idempotency-lease-seconds", "1", "--max-num-seqs", "4", "--metrics-key", "m"]
    replicas = [start_surge(tiny_model_dir, tmp_path / f"surge-{i}.log", *common) for i in range(2)]
    for replica in replicas:
        replica.wait_ready()
    fleet = Fleet(replicas, [], tmp_path)
    router = fleet.router("round_robin", "--health-check-interval-secs", "1", "--health-failure-threshold", "1")
    keys = [f"kill-{uuid.uuid4().hex}" for _ in range(12)]

    def long_request(key: str) -> dict[str, Any]:
        """A request of its own per key, long enough to be running when the replica dies."""
        messages = [{"role": "user", "content": f"Go on, {key}."}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
        return {"json": body, "headers": {"authorization": f"Bearer {KEY}", "idempotency-key": key}}

    def ask(key: str) -> tuple[int, dict[str, Any], int]:
        attempts = 0
        with httpx.Client(base_url=router.url, timeout=60) as client:
            for attempts in range(1, 200):
                try:
                    reply = client.post("/v1/chat/completions", **long_request(key))
                except httpx.TransportError:
                    continue
                if reply.status_code == 200:
                    return reply.status_code, reply.json(), attempts
                time.sleep(0.25)  # 409 (the key's lease still held), 5xx (the dead replica)
        return 0, {}, attempts

    try:
        with ThreadPoolExecutor(len(keys)) as pool:
            futures = [pool.submit(ask, key) for key in keys]
            deadline = time.monotonic() + 30
            while running(replicas[0]) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert running(replicas[0]) > 0  # it dies with requests in flight
            replicas[0].stop(graceful=False)  # SIGKILL: no draining, no goodbye
            answers = [future.result() for future in futures]
        assert all(status == 200 for status, _, _ in answers), [(s, a) for s, _, a in answers]
        with httpx.Client(base_url=router.url, timeout=60) as client:
            for key, (_, answer, _) in zip(keys, answers, strict=True):
                body = {"model": MODEL, "messages": [{"role": "user", "content": f"Go on, {key}."}], "max_tokens": 300}
                body |= {"ignore_eos": True, "temperature": 0}
                again = client.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {KEY}", "idempotency-key": key},
                )
                assert again.status_code == 200 and again.headers.get("idempotent-replayed") == "true"
                assert again.json() == answer
    finally:
        router.stop()
        for replica in replicas:
            replica.stop(graceful=False)
