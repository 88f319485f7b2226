"""Concurrent requests per API key, through a real server: one key's burst cannot take the queue."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.live_server import MODEL_NAME, running_server

LONG = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "go"}], "max_tokens": 1500, "ignore_eos": True}


def test_one_keys_burst_cannot_take_every_place(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The attack: no per-key concurrency or queue share, so one key's burst took all the queue's
    places and every other tenant got 503s. Each key now has its limit in flight; others go on."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-burst": None, "sk-other": {"max_concurrent": 0}}))  # 0: no limit for it
    # A third slot for the other tenant, so it is served at once rather than queued behind 1,500-token
    # streams; degradation off: a long queue wait would shed the last request with a 503, which is
    # degradation's test, not this one's.
    settings = {
        "max_model_len": 2048,
        "max_num_seqs": 3,
        "keys_file": str(keys),
        "max_concurrent_per_key": 2,
        "degrade_thresholds": "",
    }
    with running_server(tiny_model_dir, **settings) as live:  # type: ignore[arg-type]
        url = f"{live.url}/v1/chat/completions"

        def headers(key: str) -> dict[str, str]:
            return {"authorization": f"Bearer {key}"}

        with httpx.Client(timeout=60) as client:
            streams = [
                client.stream("POST", url, json={**LONG, "stream": True}, headers=headers("sk-burst")) for _ in range(2)
            ]
            opened = [stream.__enter__() for stream in streams]
            try:
                lines = [response.iter_lines() for response in opened]
                for line in lines:
                    next(line)  # both in flight
                refused = client.post(url, json={**LONG, "max_tokens": 1}, headers=headers("sk-burst"))
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["code"] == "rate_limit_exceeded" and refused.headers["retry-after"]
                other = client.post(url, json={**LONG, "max_tokens": 1}, headers=headers("sk-other"))
                assert other.status_code == 200  # another tenant is not held back
            finally:
                for stream in streams:
                    stream.__exit__(None, None, None)
            # Its requests ended (closed): once the server has seen the disconnects (the engine has
            # dropped both streams), the key has its places back.
            live.wait_idle()
            assert client.post(url, json={**LONG, "max_tokens": 1}, headers=headers("sk-burst")).status_code == 200
            metrics = client.get(f"{live.url}/metrics").text
            assert f'surge_rate_limited_requests_total{{bucket="concurrency",model="{MODEL_NAME}"}} 1.0' in metrics
        live.wait_idle()
