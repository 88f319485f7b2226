"""The CPUs this process may use, and what they advertise. No torch here: the benchmark's driver asks too."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    """What the CPU advertises (/proc/cpuinfo's model name and flags). Advertised is not proven:
    a fast path taken on these flags is probed first (models/loading/dtype_choice.py,
    models/linear/block_kernel.py)."""

    model_name: str
    flags: frozenset[str]

    @property
    def native_bf16(self) -> bool:
        """bfloat16 matmul in hardware: AVX512-BF16 dot products or AMX-BF16 tiles."""
        return bool({"avx512_bf16", "amx_bf16"} & self.flags)

    @property
    def amx(self) -> bool:
        return "amx_tile" in self.flags and bool({"amx_bf16", "amx_int8"} & self.flags)

    @property
    def vector_isa(self) -> str:
        """The widest matmul instructions advertised, as the docs' tables name them."""
        for name, needs in _ISA_LADDER:
            if needs <= self.flags:
                return name
        return "SSE"

    def summary(self) -> str:
        return f"{self.model_name or 'unknown CPU'} ({self.vector_isa})"


_ISA_LADDER: tuple[tuple[str, frozenset[str]], ...] = (
    ("AMX-BF16/INT8", frozenset({"amx_tile", "amx_bf16", "amx_int8"})),
    ("AVX-512 BF16", frozenset({"avx512f", "avx512_bf16"})),
    ("AVX-512 VNNI", frozenset({"avx512f", "avx512_vnni"})),
    ("AVX-512", frozenset({"avx512f"})),
    ("AVX2", frozenset({"avx2", "fma"})),
)


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFeatures:
    """The first processor's model name and flags; empty where /proc/cpuinfo is not there."""
    model_name, flags = "", ""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return CpuFeatures("", frozenset())
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model_name:
            model_name = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = value
        if model_name and flags:
            break
    return CpuFeatures(model_name, frozenset(flags.split()))


@dataclass(frozen=True, slots=True)
class ChildFailed:
    """Why a probe child gave no output: a signal (an instruction the CPU faults on), a timeout,
    an exit status."""

    why: str


def run_in_child(code: str, args: list[str], timeout_s: float) -> str | ChildFailed:
    """Run Python `code` in a child process (this interpreter; `args` as its argv[1:]) and return
    its stdout. A fast path is tried there first: a fault kills the child, not the caller."""
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return ChildFailed(f"did not finish in {timeout_s:.0f} s")
    if done.returncode < 0:
        return ChildFailed(f"died with signal {-done.returncode}")
    if done.returncode != 0:
        return ChildFailed(f"exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return done.stdout
