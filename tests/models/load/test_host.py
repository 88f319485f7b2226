"""The machine's CPU and memory figures (models/load/host.py) from cgroup and /proc files written
here, on an injected clock: the files' formats are the kernel's."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from models.load.host import MIN_INTERVAL_SECONDS, SMOOTHING_SECONDS, HostSampler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    cgroup, proc = tmp_path / "cgroup", tmp_path / "proc"
    cgroup.mkdir()
    proc.mkdir()
    return cgroup, proc


def write_cgroup(cgroup: Path, usage_usec: int, *, quota: str = "200000 100000", current: int = 0) -> None:
    (cgroup / "cpu.stat").write_text(f"usage_usec {usage_usec}\nuser_usec {usage_usec}\nsystem_usec 0\n")
    (cgroup / "cpu.max").write_text(quota + "\n")
    (cgroup / "memory.max").write_text(f"{8 << 30}\n")
    (cgroup / "memory.current").write_text(f"{current}\n")
    (cgroup / "memory.stat").write_text(f"anon {current}\nfile 0\ninactive_file {1 << 30}\nactive_file 0\n")


def test_a_containers_cpu_is_its_share_of_the_quota_smoothed(dirs: tuple[Path, Path]) -> None:
    cgroup, proc = dirs
    clock = Clock()
    sampler = HostSampler(cgroup, proc, clock)
    write_cgroup(cgroup, 0)
    assert sampler.sample().cpu == 0.0  # the first read has nothing to compare with
    clock.now += 2.0
    write_cgroup(cgroup, 4_000_000)  # 4 CPU-seconds in 2 s on a 2-CPU quota: all of it
    first = sampler.sample().cpu
    assert first == pytest.approx(1 - math.exp(-2.0 / SMOOTHING_SECONDS))
    for _ in range(30):  # 60 s saturated
        clock.now += 2.0
        write_cgroup(cgroup, int((clock.now - 100.0) * 2e6))
        busy = sampler.sample().cpu
    assert busy > 0.99
    clock.now += 0.5 * MIN_INTERVAL_SECONDS
    write_cgroup(cgroup, 0)
    assert sampler.sample().cpu == busy  # read at most once per interval


def test_memory_is_the_working_set_over_the_cgroup_limit(dirs: tuple[Path, Path]) -> None:
    cgroup, proc = dirs
    write_cgroup(cgroup, 0, current=(6 << 30) + (1 << 30))  # 7 GiB charged, 1 GiB of it droppable cache
    assert HostSampler(cgroup, proc, Clock()).sample().memory == pytest.approx(0.75)


def test_without_limits_the_machines_figures_count(dirs: tuple[Path, Path]) -> None:
    cgroup, proc = dirs
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text(f"{1 << 30}\n")
    (proc / "meminfo").write_text(
        "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    4000000 kB\n"
    )
    tick = os.sysconf("SC_CLK_TCK")
    cpus = os.cpu_count() or 1
    clock = Clock()
    sampler = HostSampler(cgroup, proc, clock)
    (proc / "stat").write_text("cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")
    assert sampler.sample() == (sampler.sample())  # the first read: nothing to compare with yet
    clock.now += SMOOTHING_SECONDS * 100  # long enough that the average is the last share
    busy_ticks = int(clock.now - 100.0) * tick * cpus // 2  # half the machine busy
    (proc / "stat").write_text(f"cpu  {busy_ticks} 0 0 {busy_ticks} 0 0 0 0 0 0\n")
    usage = sampler.sample()
    assert usage.memory == pytest.approx(0.75) and usage.cpu == pytest.approx(0.5, abs=0.01)


def test_what_cannot_be_read_degrades_no_one(dirs: tuple[Path, Path]) -> None:
    cgroup, proc = dirs  # empty: no cgroup files, no /proc
    usage = HostSampler(cgroup, proc, Clock()).sample()
    assert usage.cpu == 0.0 and usage.memory == 0.0


def test_the_real_machine_reads_within_bounds() -> None:
    usage = HostSampler().sample()
    assert 0.0 < usage.memory < 1.0 and usage.cpu == 0.0
