"""app/ops/diagnostics.py: SURGE_TRACEMALLOC parsing, the dump file, and SIGUSR1 in this process.
The engine child's side runs in a real `surge serve` in tests/scripts/test_reliability.py (soak)."""

from __future__ import annotations

import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.ops import diagnostics


@pytest.fixture
def restore_sigusr1() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGUSR1)
    was_tracing = tracemalloc.is_tracing()
    yield
    signal.signal(signal.SIGUSR1, previous)
    if not was_tracing:
        tracemalloc.stop()


def test_off_unless_the_variable_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(diagnostics.ENABLE_ENV, raising=False)
    assert diagnostics.tracemalloc_frames() == 0
    assert diagnostics.install_tracemalloc("server") is None
    assert diagnostics.tracemalloc_frames({diagnostics.ENABLE_ENV: "3"}) == 3
    assert diagnostics.tracemalloc_frames({diagnostics.ENABLE_ENV: "0"}) == 0
    with pytest.raises(ValueError, match="SURGE_TRACEMALLOC must be a whole number"):
        diagnostics.tracemalloc_frames({diagnostics.ENABLE_ENV: "yes"})


def test_sigusr1_writes_top_sites_then_growth_since_the_first_dump(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, restore_sigusr1: None
) -> None:
    monkeypatch.setenv(diagnostics.ENABLE_ENV, "1")
    monkeypatch.setenv(diagnostics.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(diagnostics.TOP_ENV, "5")
    dumper = diagnostics.install_tracemalloc("server")
    assert dumper is not None and tracemalloc.is_tracing()
    path = tmp_path / f"surge-tracemalloc-server-{os.getpid()}.txt"

    os.kill(os.getpid(), signal.SIGUSR1)
    first = path.read_text()
    assert first.startswith(f"# surge tracemalloc dump 1 role=server pid={os.getpid()} ")
    assert "## top 5 allocation sites by size" in first and "by growth" not in first

    hoard = [bytearray(1024) for _ in range(2000)]  # ~2 MiB from this line
    os.kill(os.getpid(), signal.SIGUSR1)
    second = path.read_text()
    growth = second.split("## top 5 allocation sites by growth since dump 1\n", 1)[1].splitlines()
    assert second.startswith("# surge tracemalloc dump 2 ")
    assert "test_diagnostics.py" in growth[0], second  # the hoard is the biggest growth
    assert len(hoard) == 2000
