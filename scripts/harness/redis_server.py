"""A real, throwaway `redis-server` on a free loopback port: no persistence, its files in a temp dir.

    with RedisServer() as redis:          # started, answering PING
        redis.url                         # redis://127.0.0.1:PORT/0
        redis.kill(); redis.start()       # kill -9, then a fresh start on the same port
        redis.freeze(); redis.thaw()      # SIGSTOP / SIGCONT
        redis.commands_processed()        # INFO stats, over a raw socket

Tests that kill, freeze or flush Redis use their own, never the machine's :6379.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from scripts.harness.ports import free_port
from scripts.harness.service import Service


class RedisServer(Service):
    def __init__(
        self, port: int | None = None, log_path: Path | None = None, password: str = "", args: tuple[str, ...] = ()
    ) -> None:
        """password: `requirepass`, which clients then send (it is in `url`); args: more of
        redis-server's, e.g. ("--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (scripts/ensure-redis.sh installs it with apt)")
        self.binary = binary
        self.port = port or free_port()
        self.log_path = log_path
        self.password = password
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="surge-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--dir", self.dir]
        if self.password:
            argv += ["--requirepass", self.password]
        argv += self.args
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            argv += ["--logfile", str(self.log_path)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING")
            time.sleep(0.02)

    def _command(self, command: bytes, timeout: float = 0.5) -> bytes:
        """One inline command's reply: a simple line (`+PONG`), or a bulk reply's payload."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            if self.password:  # its `+OK` read first, alone
                sock.sendall(f"AUTH {self.password}\r\n".encode())
                if not sock.recv(64).startswith(b"+OK"):
                    return b"-AUTH failed"
            sock.sendall(command)
            reply = b""
            while b"\r\n" not in reply:
                chunk = sock.recv(65536)
                if not chunk:
                    return reply
                reply += chunk
            head, _, rest = reply.partition(b"\r\n")
            if not head.startswith(b"$"):
                return head
            size = int(head[1:])  # `$<size>` then the payload and a CRLF
            while len(rest) < size + 2:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                rest += chunk
            return rest[:size]

    def ping(self) -> bool:
        try:
            return self._command(b"PING\r\n").startswith(b"+PONG")
        except OSError:
            return False

    def commands_processed(self) -> int:
        """Commands the server has run so far (this INFO included)."""
        for line in self._command(b"INFO stats\r\n", timeout=2.0).decode().splitlines():
            if line.startswith("total_commands_processed:"):
                return int(line.split(":", 1)[1])
        raise RuntimeError("INFO stats had no total_commands_processed")

    def kill(self) -> None:
        """kill -9: no shutdown, no goodbye to clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.thaw()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
