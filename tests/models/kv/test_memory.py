"""The memory a process may still fill: the machine's, capped by a cgroup v2 or v1 limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.kv.memory import Memory, cgroup_memory, host_memory

GIB = 2**30
MEMINFO = "MemTotal:       16777216 kB\nMemFree:         1048576 kB\nMemAvailable:    8388608 kB\n"


def _files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # cgroup v2, a 4 GiB limit: 3 GiB charged, of which 1 GiB is inactive page cache
        (
            {
                "memory.max": f"{4 * GIB}\n",
                "memory.current": f"{3 * GIB}\n",
                "memory.stat": f"anon 1\ninactive_file {GIB}\n",
            },
            (4 * GIB, 2 * GIB),
        ),
        ({"memory.max": "max\n", "memory.current": "5\n"}, None),  # v2 without a limit
        (
            {
                "memory/memory.limit_in_bytes": f"{2 * GIB}\n",
                "memory/memory.usage_in_bytes": f"{GIB}\n",
                "memory/memory.stat": f"cache 9\ntotal_inactive_file {GIB // 2}\n",
            },
            (2 * GIB, GIB // 2),
        ),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),  # v1 without a limit
        ({}, None),
    ],
)
def test_the_cgroup_limit_and_working_set(tmp_path: Path, files: dict[str, str], expected: object) -> None:
    assert cgroup_memory(_files(tmp_path, files)) == expected


def test_the_machine_without_a_limit(tmp_path: Path) -> None:
    proc = _files(tmp_path / "proc", {"meminfo": MEMINFO})
    assert host_memory(proc, tmp_path / "cgroup") == Memory(8 * GIB, 16 * GIB, "the machine")


def test_a_cgroup_limit_caps_both_total_and_free(tmp_path: Path) -> None:
    proc = _files(tmp_path / "proc", {"meminfo": MEMINFO})
    cgroup = _files(tmp_path / "cgroup", {"memory.max": f"{4 * GIB}", "memory.current": f"{3 * GIB}"})
    assert host_memory(proc, cgroup) == Memory(GIB, 4 * GIB, "the cgroup limit")
    # The machine's own free memory caps it too: a limit is no promise the node has the room.
    tight = _files(tmp_path / "tight", {"meminfo": MEMINFO.replace("8388608", "524288")})
    assert host_memory(tight, cgroup).free == GIB // 2


def test_a_limit_above_the_machine_is_the_machine(tmp_path: Path) -> None:
    proc = _files(tmp_path / "proc", {"meminfo": MEMINFO})
    cgroup = _files(tmp_path / "cgroup", {"memory.max": f"{64 * GIB}", "memory.current": "0"})
    assert host_memory(proc, cgroup).where == "the machine"


def test_this_machine_reads_as_something() -> None:
    memory = host_memory()
    assert 0 < memory.free <= memory.total
