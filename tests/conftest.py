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

# The files that take longest (a minute or so each on two slow cores: fleets, engine processes,
# autoscaling windows, the bench smokes), run first: `make test` hands files to its two workers
# in collection order (`--no-loadscope-reorder`), and a long file handed out last kept one worker
# busy alone at the end. Longest first, the two end together. A name that no longer exists is
# ignored; one missing here only runs in its usual place.
LONGEST_FILES = (
    "tests/app/test_fleet_router.py",
    "tests/app/test_engine_process_http.py",
    "tests/models/process/test_parent.py",
    "tests/k8s/test_autoscaling_metric.py",
    "tests/app/test_cli.py",
    "tests/scripts/test_bench_smoke.py",
    "tests/app/server/test_shutdown.py",
    "tests/app/test_hostile_schemas.py",
    "tests/k8s/test_canary.py",
    "tests/app/test_faults_redis.py",
    "tests/app/runtime/test_connections.py",
    "tests/models/loading/test_tiny.py",
    "tests/scripts/test_load_memory.py",
    "tests/app/test_preemption.py",
    "tests/app/test_replicas.py",
    "tests/scripts/test_bench_fleet.py",
    "tests/scripts/test_bench_prefix.py",
    "tests/app/ops/test_logs.py",
    "tests/app/server/test_keys_reload.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """LONGEST_FILES first, in that order; every other test keeps its place after them."""
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


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
