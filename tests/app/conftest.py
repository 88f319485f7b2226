"""The session's real surge server on loopback, serving the tiny model, shared by the HTTP tests
(tests/live_server.py runs it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.live_server import LiveServer, running_server


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=512, max_num_seqs=8, max_num_batched_tokens=128) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
