"""scripts/harness/procs.py: this process as /proc shows it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from scripts.harness.procs import cpu_seconds, machine_line, peak_rss_bytes, process_tree, rss_bytes

NO_SUCH_PID = 2**22 + 12345


def test_memory_and_cpu_of_this_process_and_of_none() -> None:
    assert rss_bytes(os.getpid()) > 10 * 2**20
    assert peak_rss_bytes(os.getpid()) >= rss_bytes(os.getpid())
    assert cpu_seconds(os.getpid()) > 0
    assert rss_bytes(NO_SUCH_PID) == 0 and peak_rss_bytes(NO_SUCH_PID) == 0 and cpu_seconds(NO_SUCH_PID) == 0.0


def test_the_tree_holds_a_child_and_its_child() -> None:
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)'])"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(200):
            tree = process_tree(parent.pid)
            if len(tree) == 2:
                break
            time.sleep(0.05)
        assert tree[0] == parent.pid and len(tree) == 2
        assert parent.pid in process_tree(os.getpid())
    finally:
        for pid in reversed(process_tree(parent.pid)):
            os.kill(pid, 9)
        parent.wait()


def test_the_machine_line_names_cpus_and_python() -> None:
    line = machine_line()
    assert f"{os.cpu_count()} CPUs" in line and "Python 3." in line
