"""Fair places in the engine's queue, through a real server: one API key's burst does not hold
another key's request behind all of it (models/scheduler/fair_shares.py; the scheduler's order itself is
tests/models/scheduler/test_scheduler.py's)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.live_server import MODEL_NAME, running_server

KEYS = ("sk-burst", "sk-other")
BURST = 8


def test_one_keys_burst_does_not_queue_another_key_behind_all_of_it(tiny_model_dir: Path) -> None:
    """The finding: the queue was FIFO within a tier, so a key that sent 8 (or 200) requests at
    once held every other key's request of its tier behind all of them. With one slot, the other
    key's request now finishes after about two of the burst's, not after all eight."""
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True}
    with running_server(tiny_model_dir, max_model_len=128, max_num_seqs=1, api_key=KEYS, dedup_ttl_seconds=0) as live:
        finished: list[str] = []

        async def post(client: httpx.AsyncClient, key: str, name: str) -> None:
            response = await client.post(
                "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
            )
            assert response.status_code == 200, response.text
            finished.append(name)

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=live.url) as client:
                burst = [asyncio.create_task(post(client, KEYS[0], f"burst-{i}")) for i in range(BURST)]
                deadline = time.monotonic() + 30
                while live.engine.core.num_waiting < BURST - 1:  # one runs, the rest wait
                    assert time.monotonic() < deadline, "the burst never queued"
                    await asyncio.sleep(0.005)
                await post(client, KEYS[1], "other")
                await asyncio.gather(*burst)

        asyncio.run(scenario())
        assert finished.index("other") <= 2, finished
        assert len(finished) == BURST + 1
        live.wait_idle()
