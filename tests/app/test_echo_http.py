"""`--model echo` over HTTP: streams, /ready and /metrics work with no forward pass behind them."""

from __future__ import annotations

import json

import httpx

from tests.live_server import MODEL_NAME, running_server


def test_echo_streams_exactly_max_tokens_over_http() -> None:
    with running_server("echo", max_num_seqs=4, max_num_batched_tokens=64) as live:
        assert httpx.get(f"{live.url}/ready").status_code == 200
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 40,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        events = []
        with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=body, timeout=30) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: ") :])
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] == 40
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert "echo" in text
        metrics = httpx.get(f"{live.url}/metrics").text
        assert f'surge_generation_tokens_total{{model="{MODEL_NAME}"}} 40.0' in metrics  # warmup not counted
