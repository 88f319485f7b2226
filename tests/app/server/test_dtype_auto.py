"""A server on `--dtype auto`, as users start it: on a CPU with bf16 units that is bfloat16 where
the probe measures it faster (the rest of the suite pins float32: tests/conftest.py), and it
answers, streams, and repeats a greedy reply, with the choice and its reason at start."""

from __future__ import annotations

import logging
from pathlib import Path

import openai
import pytest

from models.runner.cpus import cpu_features
from tests.live_server import MODEL_NAME, running_server


def test_auto_serves_on_what_it_chose(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="surge.loader"), running_server(tiny_model_dir, dtype="auto") as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Say something about the sea."}]
        replies = [
            client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0)  # type: ignore[arg-type]
            for _ in range(2)
        ]
        stream = client.chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            max_tokens=12,
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    first = replies[0].choices[0].message.content
    assert first and replies[0].usage is not None and replies[0].usage.completion_tokens == 12
    # Alone each time, so the same tokens whatever the dtype.
    assert replies[1].choices[0].message.content == first == streamed
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("dtype "))
    assert line.startswith(("dtype float32 (auto: ", "dtype bfloat16 (auto: ")) and cpu_features().summary() in line
    if not cpu_features().native_bf16:
        assert line.startswith("dtype float32 ")
