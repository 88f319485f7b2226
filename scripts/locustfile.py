"""Locust load test of surge's streaming chat completions, with time to first token as its own metric.

    pip install locust                       # not a dependency of surge; `make test` runs it (dev extra)
    locust -f scripts/locustfile.py --host http://127.0.0.1:8000 --headless -u 16 -r 4 -t 60s

Each user streams chat completions with a random prompt and output length. Locust's statistics
then carry three rows per request (request_type / name):
- `POST chat (stream)`: until the response headers arrive (what Locust times by itself);
- `TTFT chat (stream)`: until the first content token, fired with `events.request.fire`;
- `E2E chat (stream)`: until the stream ended (`data: [DONE]`), with the completion tokens as its length.
A non-200 status, an error event or a stream without a finish_reason counts as a failure.
Environment: SURGE_API_KEY (Bearer key), SURGE_MODEL_NAME (default: the first id in /v1/models).
`python -m scripts.loadtest` is the lighter tool with percentiles and a plot built in.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

from locust import HttpUser, between, events, task

WORD_TEXT = "time year people way day man thing woman life child world school state family student group"
WORDS = WORD_TEXT.split()
NAME = "chat (stream)"


class ChatUser(HttpUser):
    wait_time = between(0.1, 1.0)

    def on_start(self) -> None:
        if api_key := os.environ.get("SURGE_API_KEY"):
            self.client.headers["Authorization"] = f"Bearer {api_key}"
        self.model = os.environ.get("SURGE_MODEL_NAME") or self.client.get("/v1/models").json()["data"][0]["id"]

    @task
    def stream_chat(self) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": " ".join(random.choices(WORDS, k=random.randint(8, 64)))}],
            "max_tokens": random.randint(16, 128),
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.perf_counter()
        first_token_at: float | None = None
        finish_reason, usage, error = None, None, None
        with self.client.post(
            "/v1/chat/completions", json=body, stream=True, catch_response=True, name=NAME
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
                return
            for raw in response.iter_lines():
                line = raw.decode() if isinstance(raw, bytes) else raw
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue  # keep-alive comments, blank separators, the end marker
                chunk: dict[str, Any] = json.loads(line[5:])
                if "error" in chunk:
                    error = str(chunk["error"])
                    break
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    if first_token_at is None and (choice.get("delta") or {}).get("content"):
                        first_token_at = time.perf_counter()
                        self._fire("TTFT", first_token_at - start, 0)
                    finish_reason = choice.get("finish_reason") or finish_reason
            if error is None and finish_reason is None:
                error = "stream ended without a finish_reason"
            if error is not None:
                response.failure(error)
                return
            response.success()
        num_tokens = int(usage["completion_tokens"]) if usage else 0
        self._fire("E2E", time.perf_counter() - start, num_tokens)

    def _fire(self, request_type: str, seconds: float, length: int) -> None:
        events.request.fire(
            request_type=request_type,
            name=NAME,
            response_time=seconds * 1000,  # Locust's unit: milliseconds
            response_length=length,
            exception=None,
            context={},
        )
