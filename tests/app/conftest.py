"""A real surge server on loopback, serving the tiny model, shared by the HTTP tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from app.server import create_app
from app.settings import Settings
from app.state import ServerState
from models.async_engine import AsyncEngine
from tests.live_server import serve_app

MODEL_NAME = "tiny-test"


@dataclass(frozen=True)
class LiveServer:
    url: str
    state: ServerState

    @property
    def engine(self) -> AsyncEngine:
        assert self.state.engine is not None
        return self.state.engine

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until the engine holds no running or waiting request (fails the test if never)."""
        deadline = time.monotonic() + timeout
        core = self.engine.core
        while core.num_running or core.num_waiting or core._requests:
            if time.monotonic() > deadline:
                raise AssertionError(f"engine not idle: running={core.num_running} waiting={core.num_waiting}")
            time.sleep(0.01)


def wait_ready(base_url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{base_url}/ready").status_code == 200:
            return
        time.sleep(0.05)
    raise RuntimeError("server did not become ready")


@contextmanager
def running_server(model: Path | str, **settings: object) -> Iterator[LiveServer]:
    """`model`: a model directory, or a name `--model` takes (`echo`).

    The engine runs on a thread here unless `engine_mode="process"` is passed: many tests reach
    into it (its counters, a failing forward pass). The process mode has its own tests
    (tests/models/test_engine_process.py, tests/app/test_engine_process_http.py) and is what
    `surge serve` subprocess tests run.
    """
    settings.setdefault("engine_mode", "thread")
    app = create_app(Settings(model=str(model), served_model_name=MODEL_NAME, **settings))  # type: ignore[arg-type]
    with serve_app(app) as base_url:
        wait_ready(base_url)
        yield LiveServer(base_url, app.state.surge)


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=512, max_num_seqs=8, max_num_batched_tokens=128) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
