"""The memory this process may still fill: on CUDA the device's, on the CPU the machine's capped
by a cgroup memory limit (a Kubernetes pod's `resources.limits.memory`).

On the CPU the cgroup counts toward its limit what the OOM killer will not reclaim: its usage
less inactive file pages (the page cache a read of the weights leaves behind, which the kernel
drops first). That is the working set kubelet evicts on, so a budget taken from it is the one
the pod is judged by.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

# cgroup v1 reports "no limit" as a page-rounded 2^63 - 1; anything past this is no limit.
_NO_LIMIT = 2**62


@dataclass(frozen=True, slots=True)
class Memory:
    free: int  # bytes this process may still allocate
    total: int  # bytes it may hold at most (the device, the machine, or the cgroup limit)
    where: str  # for the log: "cuda:0", "the machine", "the cgroup limit"


def device_memory(device: torch.device) -> Memory:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return Memory(free, total, str(device))
    return host_memory()


def host_memory(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> Memory:
    """The machine's MemAvailable and MemTotal, capped by this process's cgroup limit if any."""
    info = _meminfo(proc / "meminfo")
    free, total = info.get("MemAvailable", info.get("MemFree", 0)), info.get("MemTotal", 0)
    limited = cgroup_memory(cgroup)
    if limited is None:
        return Memory(free, total, "the machine")
    limit, working_set = limited
    if limit >= total:
        return Memory(free, total, "the machine")
    return Memory(max(0, min(free, limit - working_set)), limit, "the cgroup limit")


def cgroup_memory(root: Path = Path("/sys/fs/cgroup")) -> tuple[int, int] | None:
    """(limit, working set) in bytes from cgroup v2 (`memory.max`) or v1; None: no limit."""
    v2 = _read_int(root / "memory.max")
    if v2 is not None:
        current = _read_int(root / "memory.current") or 0
        return v2, current - _stat(root / "memory.stat", "inactive_file")
    v1 = _read_int(root / "memory" / "memory.limit_in_bytes")
    if v1 is None or v1 >= _NO_LIMIT:
        return None
    usage = _read_int(root / "memory" / "memory.usage_in_bytes") or 0
    return v1, usage - _stat(root / "memory" / "memory.stat", "total_inactive_file")


def _read_int(path: Path) -> int | None:
    """The integer in a cgroup file; None when it is missing, unreadable or `max`."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _meminfo(path: Path) -> dict[str, int]:
    """/proc/meminfo in bytes (its figures are in kB)."""
    values: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                values[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except (OSError, ValueError):
        pass
    return values


def format_bytes(size: int) -> str:
    """`size` bytes for a log line: `31.0 MiB`, `20.2 GiB`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop always returns
