"""The dedup cache through the real HTTP server: identical deterministic requests share one run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from tests.live_server import MODEL_NAME, running_server

BODY = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "same"}], "max_tokens": 60, "temperature": 0}


async def _json(client: httpx.AsyncClient, url: str, **extra: object) -> str:
    response = await client.post(url, json={**BODY, **extra})
    assert response.status_code == 200
    return str(response.json()["choices"][0]["message"]["content"])


async def _stream(client: httpx.AsyncClient, url: str) -> str:
    text = ""
    async with client.stream("POST", url, json={**BODY, "stream": True}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    return text


def test_identical_requests_run_once_and_get_the_same_text(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, max_model_len=512, max_num_seqs=8) as live:
        url = f"{live.url}/v1/chat/completions"
        dedup = live.state.dedup

        async def burst() -> list[str]:
            async with httpx.AsyncClient(timeout=30) as client:
                return await asyncio.gather(
                    _stream(client, url), _json(client, url), _stream(client, url), _json(client, url)
                )

        texts = asyncio.run(burst())
        assert len(set(texts)) == 1 and texts[0]
        assert (dedup.num_misses, dedup.num_hits) == (1, 3)

        async def again() -> tuple[str, str]:
            async with httpx.AsyncClient(timeout=30) as client:
                cached = await _json(client, url)
                fresh = await client.post(url, json=BODY, headers={"Cache-Control": "no-cache"})
                return cached, str(fresh.json()["choices"][0]["message"]["content"])

        cached, fresh = asyncio.run(again())
        assert cached == fresh == texts[0]
        assert (dedup.num_misses, dedup.num_hits, dedup.num_bypassed) == (1, 4, 1)
        live.wait_idle()


def test_one_tenant_never_gets_another_tenants_completion(tiny_model_dir: Path) -> None:
    """The attack: key B sends key A's prompt and gets A's stored completion, or learns from a hit
    that A sent it. Scoped per key by default; `--dedup-scope global` shares across keys."""
    keys = ("sk-tenant-a", "sk-tenant-b")
    for scope, shared in (("key", False), ("global", True)):
        settings = {"api_key": keys, "dedup_scope": scope, "metrics_key": "mk-test"}  # API keys: /metrics needs it
        with running_server(tiny_model_dir, max_model_len=512, **settings) as live:
            url = f"{live.url}/v1/chat/completions"
            dedup = live.state.dedup

            def send(key: str, url: str = url) -> httpx.Response:
                return httpx.post(url, json=BODY, headers={"authorization": f"Bearer {key}"}, timeout=30)

            first = send(keys[0])
            assert send(keys[0]).json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
            assert (dedup.num_misses, dedup.num_hits) == (1, 1)  # the same tenant shares
            other = send(keys[1])
            assert other.status_code == 200
            assert (dedup.num_misses, dedup.num_hits) == ((1, 2) if shared else (2, 1)), scope
            metrics = live.scrape().text
            assert f'surge_dedup_hits_total{{model="{MODEL_NAME}"}} {2.0 if shared else 1.0}' in metrics
            live.wait_idle()
