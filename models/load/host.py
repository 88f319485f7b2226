"""What the machine (or the container) has left: CPU busy share and memory in use, for degradation.

Both are read from the container's cgroup (v2) where it has limits, since that is what the
kernel enforces: a pod at its CPU quota is throttled, at its memory limit OOM-killed, whatever the
node has free. Without a limit (a bare machine, a pod without limits) they come from /proc: the
whole machine's CPU and memory. Memory in use is the working set, as the kubelet counts it: page
cache the kernel can drop at once (inactive file pages, such as safetensors read once) does not
count. CPU busy is the share of the quota (or of the CPUs this process may run on) used since the
previous sample, smoothed over `SMOOTHING_SECONDS`.

Reading is a few small files; `sample()` reads at most once per `MIN_INTERVAL_SECONDS` and
returns the last figures in between. A file that cannot be read gives 0.0: a signal that cannot
be measured must not degrade anyone.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("surge.load")

MIN_INTERVAL_SECONDS = 1.0
# The CPU share is an exponential average with this time constant: a second of full use (one
# compile, one garbage collection) is not a saturated machine; ten are.
SMOOTHING_SECONDS = 10.0
CGROUP = Path("/sys/fs/cgroup")
PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class HostUsage:
    cpu: float  # 0..1 of the CPU the container (or machine) may use, smoothed
    memory: float  # 0..1 of its memory limit (or the machine's memory) in the working set


class HostSampler:
    def __init__(self, cgroup: Path = CGROUP, proc: Path = PROC, clock: Callable[[], float] = time.monotonic) -> None:
        self._cgroup, self._proc, self._clock = cgroup, proc, clock
        self._last = HostUsage(0.0, 0.0)
        self._next_read = float("-inf")
        self._cpu_at: tuple[float, float] | None = None  # (clock, CPU seconds used) at the last read
        self._cpu_share = 0.0

    def sample(self) -> HostUsage:
        now = self._clock()
        if now >= self._next_read:
            self._next_read = now + MIN_INTERVAL_SECONDS
            self._last = HostUsage(self._read_cpu(now), self._read_memory())
        return self._last

    # --- CPU ------------------------------------------------------------------------------

    def _read_cpu(self, now: float) -> float:
        used = self._cpu_seconds()
        if used is None:
            return 0.0
        previous, self._cpu_at = self._cpu_at, (now, used)
        if previous is None or now <= previous[0]:
            return self._cpu_share
        elapsed = now - previous[0]
        share = min(1.0, max(0.0, (used - previous[1]) / (elapsed * self._cpu_capacity())))
        weight = 1.0 - math.exp(-elapsed / SMOOTHING_SECONDS)
        self._cpu_share += weight * (share - self._cpu_share)
        return self._cpu_share

    def _cpu_seconds(self) -> float | None:
        """CPU seconds the container (cgroup v2) or the machine (/proc/stat) has used so far."""
        stat = _read(self._cgroup / "cpu.stat")
        if stat is not None:
            for line in stat.splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) / 1e6
        machine = _read(self._proc / "stat")
        if machine is None:
            return None
        fields = machine.splitlines()[0].split()[1:]  # "cpu user nice system idle iowait irq softirq steal ..."
        ticks = [int(field) for field in fields[:8]]
        busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        return busy / os.sysconf("SC_CLK_TCK")

    def _cpu_capacity(self) -> float:
        """CPUs' worth the container may use: its quota (cpu.max), else the CPUs it may run on."""
        limit = _read(self._cgroup / "cpu.max")
        if limit is not None:
            quota, _, period = limit.strip().partition(" ")
            if quota != "max" and period:
                return max(0.01, int(quota) / int(period))
        if _read(self._cgroup / "cpu.stat") is not None:
            return float(len(os.sched_getaffinity(0)))
        return float(os.cpu_count() or 1)  # /proc/stat counts every CPU of the machine

    # --- memory ---------------------------------------------------------------------------

    def _read_memory(self) -> float:
        limit = _read(self._cgroup / "memory.max")
        current = _read(self._cgroup / "memory.current")
        if limit is not None and current is not None and limit.strip() != "max":
            inactive_file = 0
            for line in (_read(self._cgroup / "memory.stat") or "").splitlines():
                name, _, value = line.partition(" ")
                if name == "inactive_file":
                    inactive_file = int(value)
            return min(1.0, max(0, int(current) - inactive_file) / max(1, int(limit)))
        meminfo = _read(self._proc / "meminfo")
        if meminfo is None:
            return 0.0
        fields = {}
        for line in meminfo.splitlines():
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0]) if rest.split() else 0
        total, available = fields.get("MemTotal", 0), fields.get("MemAvailable", 0)
        return 1.0 - available / total if total else 0.0


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, ValueError):
        return None
