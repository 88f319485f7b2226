"""The CPUs this process may use. No torch here: the benchmark's driver asks too."""

from __future__ import annotations

import math
import os
from pathlib import Path


def prefill_thread_count(num_threads: int, prefill_threads: int) -> int:
    """Threads for a burst's prefill: `prefill_threads`, 0 meaning every available CPU, never
    fewer than the decode steps' `num_threads`."""
    return max(prefill_threads or available_cpus(), num_threads)


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota (a
    Kubernetes CPU limit; `os.cpu_count()` would report the whole node)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of quota from cgroup v2 (`cpu.max`) or v1 (`cpu.cfs_quota_us`); None: no limit."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


# oneDNN (torch's kernels for packed float32 linears, models/linear/packed.py, and for bfloat16
# matmuls on the CPU) keeps each input shape's primitive in two caches of 1,024 entries by default,
# its own and ideep's: ~0.55 MB a shape, so a server whose steps take every row count from 1 to
# 2,048 grew by ~280 MB per 512 shapes. At 64 entries each the growth stayed ~26 MB, and a shape
# rebuilt after eviction still ran faster than MKL's sgemm (measured on a 2-core AMD EPYC).
ONEDNN_CACHE_CAPACITY = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def bound_onednn_caches(environ: dict[str, str] | None = None) -> None:
    """Set ONEDNN_CACHE_CAPACITY where the environment does not say otherwise. Must run before
    torch is imported: both caches read their capacity once."""
    env = os.environ if environ is None else environ
    for name, value in ONEDNN_CACHE_CAPACITY.items():
        env.setdefault(name, value)
