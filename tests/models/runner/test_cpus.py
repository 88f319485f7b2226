"""The CPUs a process may use: affinity, capped by a cgroup quota (a Kubernetes CPU limit)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from models.runner.cpus import CpuFeatures, available_cpus, cgroup_cpu_quota, cpu_features, prefill_thread_count


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


SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: ignored: the first processor speaks for all
"""
ZEN3 = "model name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2 fma\n"


def test_cpu_features_read_the_model_name_and_flags(tmp_path: Path) -> None:
    (tmp_path / "spr").write_text(SAPPHIRE_RAPIDS)
    spr = cpu_features(tmp_path / "spr")
    assert spr.model_name.startswith("Intel(R) Xeon(R) Platinum 8481C")
    assert spr.native_bf16 and spr.amx and spr.vector_isa == "AMX-BF16/INT8"
    (tmp_path / "zen3").write_text(ZEN3)
    zen3 = cpu_features(tmp_path / "zen3")
    assert not zen3.native_bf16 and not zen3.amx and zen3.vector_isa == "AVX2"
    assert zen3.summary() == "AMD EPYC (AVX2)"
    assert cpu_features(tmp_path / "missing") == CpuFeatures("", frozenset())


def test_this_machines_features_are_read() -> None:
    here = cpu_features()
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("no /proc/cpuinfo")
    assert here.flags and here.vector_isa in here.summary()
