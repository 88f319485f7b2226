"""Two real `surge serve` processes sharing one real redis-server.

The replicas serve DIFFERENT models (a tiny Llama and a tiny Qwen2 with the same tokenizer)
under one served name. So when a response from replica B equals replica A's model output,
B did not run its own model: the proof that shared state, not luck, made them agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from models.loading.tiny import build_tiny
from scripts.harness.redis_server import RedisServer
from scripts.harness.servers import start_surge

NAME = "shared"
USER = [{"role": "user", "content": "Replicas, agree!"}]
FREE = {"Authorization": "Bearer sk-free"}  # no limits
LIMITED = {"Authorization": "Bearer sk-limited"}  # 12 requests per minute, shared by the replicas


REPLICA_ARGS = ("--served-model-name", NAME, "--redis-timeout-ms", "2000", "--max-model-len", "256")
REPLICA_ARGS += ("--max-num-seqs", "8", "--log-level", "warning")


@pytest.fixture(scope="module")
def replicas(tiny_model_dir: Path, model_root: Path) -> Iterator[tuple[str, str, str]]:
    # The session's builds (4 s each on the 2-core VM): the `s` Llama every HTTP test serves, and the
    # `s` Qwen2 at the path tests/models/conftest.py's arch_dir("qwen2") builds it, whichever runs first.
    llama = tiny_model_dir
    qwen = model_root / "arch-qwen2"
    if not qwen.exists():
        build_tiny("s", qwen, arch="qwen2")
    keys = model_root / "replica-keys.yaml"
    keys.write_text("sk-free: {}\nsk-limited: {rpm: 12}\n")
    logs = model_root / "replica-logs"
    args = (*REPLICA_ARGS, "--keys-file", str(keys))
    with RedisServer() as redis:
        a = start_surge(llama, logs / "a.log", *args, "--redis-url", redis.url)
        b = start_surge(qwen, logs / "b.log", *args, "--redis-url", redis.url)
        try:
            a.wait_ready()
            b.wait_ready()
            yield a.url, b.url, redis.url
        finally:
            # Their shutdown is not under test (tests/app/server/test_shutdown.py): a graceful stop each was
            # 2.7 s of teardown (the 2 s drain delay).
            a.stop(graceful=False)
            b.stop(graceful=False)


def _post(url: str, body: dict[str, object], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={**FREE, **headers}, timeout=60)


def _text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_the_replicas_really_serve_different_models(replicas: tuple[str, str, str]) -> None:
    a, b, _ = replicas
    body = {"model": NAME, "messages": USER, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    text_a = _text(_post(a, body, **{"Cache-Control": "no-cache"}))
    text_b = _text(_post(b, body, **{"Cache-Control": "no-cache"}))
    assert text_a != text_b


def test_dedup_result_made_on_one_replica_is_replayed_by_the_other(replicas: tuple[str, str, str]) -> None:
    a, b, _ = replicas
    body = {"model": NAME, "messages": [{"role": "user", "content": "dedup me"}], "max_tokens": 20, "seed": 5}
    first = _text(_post(a, body))
    second = _text(_post(b, body))
    own_b = _text(_post(b, body, **{"Cache-Control": "no-cache"}))
    assert second == first != own_b


def test_one_idempotency_key_runs_once_across_replicas(replicas: tuple[str, str, str]) -> None:
    a, b, _ = replicas
    # Sampled (no seed), so the dedup cache stays out of it: only the idempotency key can unify them.
    body = {"model": NAME, "messages": [{"role": "user", "content": "pay once"}], "max_tokens": 30, "temperature": 1}
    headers = {**FREE, "Idempotency-Key": "invoice-17"}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:

            async def one(i: int) -> httpx.Response:
                url = a if i % 2 else b
                for _ in range(200):  # a 409 means "still running": retry as the SDK would
                    response = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                    if response.status_code != 409:
                        return response
                    await asyncio.sleep(0.05)
                return response

            return await asyncio.gather(*(one(i) for i in range(50)))

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 50
    assert len({r.content for r in responses}) == 1
    assert sum(1 for r in responses if "idempotent-replayed" not in r.headers) == 1


def test_the_rate_limit_holds_across_replicas(replicas: tuple[str, str, str]) -> None:
    a, b, _ = replicas
    body = {"model": NAME, "messages": USER, "max_tokens": 1}
    statuses = [_post(a if i % 2 else b, body, **LIMITED).status_code for i in range(16)]
    # 12 per minute between them; the few admitted during the test's own second of refill aside.
    admitted = statuses.count(200)
    assert 12 <= admitted <= 13, statuses
    assert statuses.count(429) == 16 - admitted
