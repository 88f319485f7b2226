"""A server's processes, read from Linux /proc: surge's engine runs in a child of the server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


def process_tree(pid: int) -> Iterator[int]:
    """`pid` and all its descendants still running (children read from /proc/PID/task/*/children)."""
    pids = [pid]
    while pids:
        current = pids.pop()
        yield current
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                pids += [int(child) for child in (task / "children").read_text().split()]
