"""A real `surge serve` process for the tests that need real signals and the real log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.ports import free_port


@dataclass
class SurgeProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def surge_process(model_dir: Path, log_path: Path, *args: str, ready_timeout: float = 90.0) -> Iterator[SurgeProcess]:
    """Start `surge serve` on a free port (stdout and stderr to `log_path`), yield it once /ready is 200."""
    port = free_port()
    env = {**os.environ, "SURGE_PORT": str(port)}
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--model", str(model_dir), *args],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server = SurgeProcess(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            try:
                if httpx.get(f"{server.url}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, server.log()
            assert time.monotonic() < deadline, "server never became ready:\n" + server.log()
            time.sleep(0.05)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
