"""The CPUs a process may use: affinity, capped by a cgroup quota (a Kubernetes CPU limit)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from models.runner.cpus import available_cpus, cgroup_cpu_quota, prefill_thread_count


def test_available_cpus_is_at_most_the_affinity_mask() -> None:
    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))


def test_prefill_threads_default_to_every_cpu_and_never_undercut_decode() -> None:
    assert prefill_thread_count(1, 3) == 3
    assert prefill_thread_count(4, 2) == 4  # never fewer than the decode steps get
    assert prefill_thread_count(1, 0) == available_cpus()


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "200000 100000\n"}, 2.0),  # cgroup v2, a Kubernetes limit of 2 CPUs
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),  # v2, no limit
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1, no limit
        ({}, None),  # no cgroup files at all
    ],
)
def test_the_cgroup_quota_in_cpus(tmp_path: Path, files: dict[str, str], expected: float | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == expected
