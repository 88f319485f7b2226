"""The C heap's policy (models/runner/heap.py): a child started as the engine's is reuses a large
freed tensor's pages instead of faulting fresh ones, and purging gives them back; the user's own
allocator settings are left alone; the engine purges once warm and whenever it falls idle,
whether or not any K/V slot had memory to release."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.runner import heap
from tests.models.engine.test_prefix import start, submit_round, tokens

# In a child: prints the page faults of one 64 MiB tensor's allocation and first write (the
# least of three), and the resident memory with 256 MiB freed, then purged.
CHILD = r"""
import json, resource
import torch
from models.runner import heap

def faults_of_one():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(16 * 2**20).fill_(1.0)  # 64 MiB, written, freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

torch.set_num_threads(1)
faults_of_one()
result = {"kept": heap.is_kept(), "faults": min(faults_of_one() for _ in range(3))}
big = torch.empty(64 * 2**20).fill_(1.0)  # 256 MiB
base = resident_mib()
del big
result["freed_mib"] = base - resident_mib()
heap.give_back()
result["purged_mib"] = base - resident_mib()
print(json.dumps(result))
"""


def _child(environ: dict[str, str]) -> dict[str, float]:
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=root, env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LD_PRELOAD", "MALLOC_CONF", heap.ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.skipif(heap.jemalloc() is None, reason="no jemalloc here (Debian/Ubuntu: libjemalloc2)")
def test_the_childs_heap_skips_the_page_faults_and_purging_gives_the_pages_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _plain(monkeypatch)
    with heap.child_environment():
        kept_environ = dict(os.environ)
    assert "LD_PRELOAD" not in os.environ and "MALLOC_CONF" not in os.environ  # the parent's, as it was
    kept, default = _child(kept_environ), _child(dict(os.environ))
    assert kept["kept"] and not default["kept"]
    assert default["faults"] > 10_000  # glibc: 16,384 pages of 4 KiB at every allocation
    assert kept["faults"] < 1_000  # kept: the same pages again
    assert kept["freed_mib"] < 32 < default["freed_mib"]  # kept: still resident for the next step
    assert kept["purged_mib"] > 200  # purged: back to the system


def test_off_by_the_variable_or_the_users_own_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ((heap.ENV, "0"), ("LD_PRELOAD", "libtcmalloc.so.4"), ("MALLOC_CONF", "narenas:2")):
        _plain(monkeypatch)
        monkeypatch.setenv(name, value)
        before = dict(os.environ)
        with heap.child_environment():
            assert dict(os.environ) == before
    assert not heap.is_kept()  # this process: glibc's malloc


async def test_the_engine_purges_once_warm_and_whenever_it_falls_idle(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    purges: list[float] = []
    # The engine's calls are recorded, not made: this process's heap stays as it was.
    monkeypatch.setattr(heap, "is_kept", lambda: True)
    monkeypatch.setattr(heap, "give_back", lambda: purges.append(time.monotonic()))
    engine = await start(tiny_model_dir, max_num_seqs=4, max_kv_tokens=1024)  # slots released at once
    try:
        await asyncio.sleep(1.5)
        assert len(purges) == 1  # warm and idle: what the load freed
        rng = random.Random(0)
        await submit_round(engine, [tokens(rng, 40) for _ in range(3)], 8)
        finished = time.monotonic()
        await asyncio.sleep(2.0)
        assert len(purges) == 2 and purges[1] - finished > 0.5  # once, after the idle delay
        await asyncio.sleep(1.5)
        assert len(purges) == 2  # idle on: nothing more to purge
        await submit_round(engine, [tokens(rng, 40)], 4)
        await asyncio.sleep(2.0)
        assert len(purges) == 3
    finally:
        engine.stop()
