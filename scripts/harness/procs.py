"""Processes as Linux /proc shows them: a server's process tree (surge's engine runs in a child of
the server), resident and peak memory, CPU time, and the machine a report ran on."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants still running (children read from /proc/PID/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
    return found


def start_ticks(pid: int) -> int:
    """When the process started, in clock ticks since boot (field 22 of /proc/PID/stat)."""
    # After the command's closing parenthesis (the command may hold spaces and parentheses).
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def spawned_children(pid: int) -> list[int]:
    """The multiprocessing children `pid` spawned, the earliest started first (surge: the engine
    process, then the embedding model's; never the resource tracker, which runs no `spawn_main`)."""
    spawned = []
    for child in process_tree(pid)[1:]:
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                spawned.append(child)
    return sorted(spawned, key=start_ticks)


def _status_kib(pid: int, field: str) -> int:
    """A `/proc/PID/status` figure in KiB (VmRSS, VmHWM); 0 when the process is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_bytes(pid: int) -> int:
    """Resident memory of one process now (VmRSS); 0 when it is gone."""
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """The most resident memory one process ever had (VmHWM); 0 when it is gone."""
    return _status_kib(pid, "VmHWM") * 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (0 when it is gone), from /proc/PID/stat."""
    try:
        # The command name (2nd field) may hold spaces and parentheses: split after the last ')'.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def machine_line() -> str:
    """One line for a report: OS, architecture, CPUs and their model, Python."""
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs ({cpu_model()}), "
        f"Python {platform.python_version()}"
    )


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"
