"""Shared fixtures: tiny model directories built once per test session, offline."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from models.runner.cpus import bound_onednn_caches
from scripts.harness.redis_server import RedisServer

# As surge serve does, before any test module imports torch (models/runner/cpus.py).
bound_onednn_caches()
# No test may reach a model hub: everything is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# `surge serve` subprocesses serve no embedding model unless a test passes --embedding-model
# (tests/live_server.py does the same for in-process servers).
os.environ.setdefault("SURGE_EMBEDDING_MODEL", "")
# The suite's expectations are float32's: greedy output the same batched or alone (bfloat16's
# rounding depends on the batch's shape), KV pools sized in float32 bytes. `--dtype auto` picks
# bfloat16 on CPUs with bf16 units, so engines and servers here ask for float32 (surge serve
# subprocesses through this variable, tests/live_server.py and the engine tests by argument);
# tests/models/loading/test_dtype_choice.py serves through `auto` on whatever CPU runs the suite.
os.environ.setdefault("SURGE_DTYPE", "float32")


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model_dir(model_root: Path) -> Path:
    """The `s` tiny Llama: the model every engine and HTTP test serves."""
    from models.loading.tiny import build_tiny

    return build_tiny("s", model_root / "llama-s")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server for the session's Redis-mode tests (flushed by `redis_url`)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis, emptied before each test so tests never see each other's keys."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url
