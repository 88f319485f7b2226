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
        "metrics_key": "mk-test",  # with API keys set, /metrics needs it
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
            metrics = live.scrape().text
            assert f'surge_rate_limited_requests_total{{bucket="concurrency",model="{MODEL_NAME}"}} 1.0' in metrics
        live.wait_idle()


def test_one_keys_fan_out_counts_every_sequence_against_its_limit(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The attack (issue 34): --max-concurrent-per-key counted requests, so one request of 16 prompts
    x n 16 was one of a key's places while it took 224 of the queue's 256. The limit now counts
    sequences: past it a 429 that names the numbers; a request larger than the whole limit a 429
    without Retry-After (waiting cannot help)."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-fan-out": None, "sk-other": None}))
    settings = {
        "max_model_len": 2048,
        "max_num_seqs": 8,
        "keys_file": str(keys),
        "max_concurrent_per_key": 8,
        "degrade_thresholds": "",
    }
    with running_server(tiny_model_dir, **settings) as live:  # type: ignore[arg-type]
        url = f"{live.url}/v1/completions"
        six = {"model": MODEL_NAME, "prompt": ["a", "b"], "n": 3, "max_tokens": 1500, "ignore_eos": True}

        def post(key: str, **body: object) -> httpx.Response:
            return httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=60)

        with httpx.stream(
            "POST", url, json={**six, "stream": True}, headers={"authorization": "Bearer sk-fan-out"}, timeout=60
        ) as running:
            lines = running.iter_lines()  # kept: a dropped iterator closes the response
            next(lines)
            short = {**six, "max_tokens": 1}
            past = post("sk-fan-out", **{**short, "n": 1, "prompt": ["a", "b", "c"]})  # 6 + 3 > 8
            assert past.status_code == 429 and past.headers["retry-after"] == "1"
            message = past.json()["error"]["message"]
            assert "6 sequences in flight and this request adds 3; its limit is 8" in message
            fits = post("sk-fan-out", **{**short, "n": 2, "prompt": "a"})  # 6 + 2: at the limit
            assert fits.status_code == 200 and len(fits.json()["choices"]) == 2
            assert post("sk-other", **short).status_code == 200  # another key has its own 8
        too_large = post("sk-fan-out", **{**short, "n": 9, "prompt": "a"})  # more than the whole limit
        assert too_large.status_code == 429 and "retry-after" not in too_large.headers
        assert "9 sequences (prompts x n), more than this API key's limit of 8" in too_large.json()["error"]["message"]
        live.wait_idle()
