"""examples/openai_*.py: the Python openai SDK, sync, async, streaming, raw headers, idempotency keys."""

from __future__ import annotations

import re

from tests.examples.conftest import metric_total, run_python_example
from tests.live_server import LiveServer


def test_sync_prints_a_chat_and_a_text_completion(examples_server: LiveServer) -> None:
    out = run_python_example("openai_sync.py", examples_server.url).stdout
    assert "finish_reason: length" in out
    assert re.search(r"usage: \d+ prompt \+ 16 completion tokens", out)
    assert re.search(r"^completion: .+", out, re.MULTILINE)


def test_async_runs_concurrent_requests_and_a_stream(examples_server: LiveServer) -> None:
    out = run_python_example("openai_async.py", examples_server.url).stdout
    for question in ("Name a colour.", "Name a fruit.", "Name a city."):
        assert f"{question} -> '" in out
    num_chunks = int(re.search(r"streamed (\d+) chunks", out).group(1))  # type: ignore[union-attr]
    assert num_chunks > 0


def test_streaming_prints_deltas_finish_reason_and_usage(examples_server: LiveServer) -> None:
    out = run_python_example("openai_streaming.py", examples_server.url).stdout
    finish = re.search(r"^finish_reason: (\w+)$", out, re.MULTILINE)
    usage = re.search(r"usage: \d+ prompt \+ (\d+) completion tokens", out)
    assert finish is not None and usage is not None, out
    # Sampled (the SDK's default temperature): the model may end early with its end token.
    completion = int(usage.group(1))
    assert (finish.group(1), completion) == ("length", 32) or (finish.group(1) == "stop" and 0 < completion < 32), out
    assert re.search(r"time to first token: \d+ ms, \d+ content chunks", out)


def test_raw_response_shows_the_rate_limit_headers(examples_server: LiveServer) -> None:
    out = run_python_example("openai_rate_limits.py", examples_server.url).stdout
    assert "(limit off)" not in out
    assert out.count("x-ratelimit-limit-requests: 100000") == 2
    remaining = [int(v) for v in re.findall(r"x-ratelimit-remaining-requests: (\d+)", out)]
    assert len(remaining) == 2 and all(value < 100_000 for value in remaining)  # each call took one
    assert re.search(r"x-ratelimit-reset-tokens: \d", out)
    assert out.count("reply: ") == 2


def test_idempotency_key_makes_the_retry_a_replay(examples_server: LiveServer) -> None:
    replays_before = metric_total(examples_server.url, "surge_idempotent_replays_total")
    out = run_python_example("openai_idempotency.py", examples_server.url).stdout
    first = re.search(r"^first: (.*) replayed: false$", out, re.MULTILINE)
    retry = re.search(r"^retry: (.*) replayed: true$", out, re.MULTILINE)
    assert first and retry and first.group(1) == retry.group(1), out  # sampled text, yet the same
    assert "same completion id: True" in out
    assert metric_total(examples_server.url, "surge_idempotent_replays_total") == replays_before + 1
