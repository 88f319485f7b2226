"""Fairness within an API key by end user (models/scheduler/fair_shares.py): in the scheduler,
then through a real server with the body's `user` and `--user-header`."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import httpx

from models.config import SchedulerConfig
from models.sampling.params import SamplingParams
from models.scheduler.scheduler import Scheduler
from models.scheduler.sequence import Sequence
from tests.live_server import MODEL_NAME, running_server


def admitted_order(sequences: list[Sequence]) -> list[Sequence]:
    """The order a one-slot scheduler admits `sequences` in, each finishing in one step."""
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64))
    for seq in sequences:
        s.add(seq)
    order = []
    while s.has_work:
        out = s.schedule()
        order += [chunk.seq for chunk in out.prefills]
        s.update_from_output(out, [7 for _ in out.sampled])
    return order


def seq(name: str, share: str, user: str) -> Sequence:
    return Sequence(name, [5, 6, 7], SamplingParams(max_tokens=1), share=share, user=user)


def test_one_users_burst_does_not_hold_the_keys_other_users_behind_it() -> None:
    burst = [seq(f"a{i}", "key:k", "alice") for i in range(6)]
    order = admitted_order([*burst, seq("b", "key:k", "bob")])
    # Two users of one key each advance by two a sequence: bob's first ties alice's second. In
    # arrival order, without users, he would be last.
    assert [x.request_id for x in order].index("b") == 2


def test_a_key_naming_many_users_gets_no_more_of_the_queue_than_one_naming_none() -> None:
    many = [seq(f"m{u}-{i}", "key:many", f"user{u}") for i in range(2) for u in range(5)]  # 5 users x 2
    one = [seq(f"o{i}", "key:one", "") for i in range(10)]
    order = admitted_order([*many, *one])
    first_half = Counter(x.share for x in order[:10])
    assert abs(first_half["key:many"] - first_half["key:one"]) <= 2, first_half


def test_through_a_server_the_header_names_the_user_before_the_body(tiny_model_dir: Path) -> None:
    """One key, one slot: 'alice' (the body's `user`) sends 6 at once; 'bob' (named by the header,
    his body's `user` says 'alice') finishes fourth at the latest (the running one, then two places
    of the key's queue shared by its two users), not last (seventh)."""
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True, "user": "alice"}
    settings = {"max_model_len": 128, "max_num_seqs": 1, "dedup_ttl_seconds": 0, "user_header": "X-User-Id"}
    with running_server(tiny_model_dir, **settings) as live:  # type: ignore[arg-type]
        finished: list[str] = []

        async def post(client: httpx.AsyncClient, name: str, headers: dict[str, str]) -> None:
            response = await client.post("/v1/completions", json=body, headers=headers, timeout=120)
            assert response.status_code == 200, response.text
            finished.append(name)

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=live.url) as client:
                burst = [asyncio.create_task(post(client, f"alice-{i}", {})) for i in range(6)]
                deadline = time.monotonic() + 30
                while live.engine.core.num_waiting < 5:
                    assert time.monotonic() < deadline, "the burst never queued"
                    await asyncio.sleep(0.005)
                await post(client, "bob", {"X-User-Id": "bob"})
                await asyncio.gather(*burst)

        asyncio.run(scenario())
        assert finished.index("bob") <= 3, finished
        live.wait_idle()
