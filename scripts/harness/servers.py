"""A server as a subprocess: on a free port, in its own process group, ready when an HTTP path says
200, stopped with SIGTERM to its whole group (then SIGKILL), so no child of it (surge's engine
process) outlives it.

NOTE: a process group, not a session, unless `own_session` is asked for: with the kernel's
autogroup scheduling (on by default) each session shares the CPU as one group, so a server in a
session of its own gets half the machine against its caller's session whatever their nice values
and SCHED_IDLE say. The reliability drivers rely on those (their load generator runs SCHED_IDLE);
the bench gives each server its own session, as a server on its own machine would have.

    with surge_server("tiny", log_dir / "surge.log", "--max-num-seqs", "4") as server:
        httpx.get(f"{server.url}/v1/models")

    servers = [start_surge(model, log, *args) for ...]   # several side by side, then
    for server in servers: server.wait_ready()
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from scripts.harness.loopback import loopback
from scripts.harness.ports import free_port
from scripts.harness.procs import cpu_seconds, peak_rss_bytes, process_tree, rss_bytes
from scripts.harness.service import Service

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0


@dataclass
class ServerProcess(Service):
    """`argv` may hold `{port}` (and other `{name}`s of `fields`); argv[0] must be the server itself,
    no wrapper shell, so that its pid's memory and signals are the server's."""

    name: str
    argv: list[str]
    log_path: Path
    ready_path: str = "/ready"
    env: Mapping[str, str] | None = None  # the whole environment; None: this process's
    fields: dict[str, str] = field(default_factory=dict)
    port: int = 0  # 0: a free one, chosen at launch
    own_session: bool = False  # see the module's NOTE
    ready_timeout_s: float = READY_TIMEOUT_S
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        """The OpenAI API root (what `base_url` of the openai SDK wants)."""
        return f"{self.url}/v1"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not launched"
        return self.proc.pid

    def launch(self) -> None:
        """Start the process and return at once (see `wait_ready`)."""
        self.port = self.port or free_port()
        fields = {"port": str(self.port), **self.fields}
        argv = []
        for arg in self.argv:
            for name, value in fields.items():
                arg = arg.replace("{" + name + "}", value)  # not str.format: other braces stay as they are
            argv.append(arg)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=None if self.env is None else dict(self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group either way: `stop` reaches its children too.
                start_new_session=self.own_session,
                process_group=None if self.own_session else 0,
            )

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until `ready_path` answers 200; RuntimeError (with the log's tail) if the process exits
        first or the time runs out."""
        proc = self.proc
        assert proc is not None, "not launched"
        wait_until_ready(
            self.url + self.ready_path,
            self.ready_timeout_s if timeout is None else timeout,
            is_alive=lambda: proc.poll() is None,
            describe=lambda: f"{self.name} (exit status {proc.poll()}, log {self.log_path}):\n{self.tail()}",
        )

    def start(self) -> None:
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = STOP_TIMEOUT_S, *, graceful: bool = True) -> None:
        """SIGTERM to the process group, then SIGKILL to it if the server is not gone in `timeout`;
        `graceful=False`: SIGKILL at once (a test's server, whose shutdown is not under test)."""
        proc = self.proc
        if proc is None:
            return
        if graceful and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        # Whatever is left of the group (a child the server did not take down with it).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        """Until `text` is in the log: an event the server announces (a signal taken, a listener
        closed), waited for rather than slept on."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} never logged {text!r}:\n{self.tail()}")
            time.sleep(0.02)

    def tail(self, num_chars: int = 3000) -> str:
        return self.log()[-num_chars:] if self.log_path.exists() else ""

    def pids(self) -> list[int]:
        """The server and its descendants (surge's engine child) still running."""
        return process_tree(self.pid)

    def rss_bytes(self) -> int:
        return sum(rss_bytes(pid) for pid in self.pids())

    def peak_rss_bytes(self) -> int:
        """The sum of each of its processes' peaks (read while they run)."""
        return sum(peak_rss_bytes(pid) for pid in self.pids())

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids())


def wait_until_ready(
    url: str,
    timeout: float = READY_TIMEOUT_S,
    *,
    is_alive: Callable[[], bool] = lambda: True,
    describe: Callable[[], str] = lambda: "",
) -> None:
    """Until GET `url` answers 200, a server's /ready (in a subprocess or in this process); a
    RuntimeError naming `describe()` if `is_alive()` turns false first or the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if loopback().get(url, timeout=5.0).status_code == 200:
                return
        if not is_alive():
            raise RuntimeError(f"exited before {url} was ready: {describe()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready within {timeout:.0f} s: {describe()}")
        time.sleep(0.05)


def surge_argv(model: str | Path, *args: str) -> list[str]:
    """`surge serve --model MODEL` on loopback at `{port}`, without an embedding model and without
    a shutdown delay, then `args` (later flags win: `--embedding-model tiny` serves one)."""
    return [
        sys.executable,
        "-m",
        "app.cli",
        "serve",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        # The chat engine alone, as the peers serve theirs: an encoder is a process of its own
        # (memory in every RSS figure, seconds of every start) that no benchmark or test of chat uses.
        "--embedding-model",
        "",
        # Stopped at once: the 2 s of 503s before the listener closes are for a load balancer's
        # next probe, and were seconds of every test's stop (tests of shutdown pass their own).
        "--shutdown-delay-seconds",
        "0",
        *args,
    ]


def surge_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without `SURGE_*` settings left in the shell (a server's settings come from
    its arguments), plus `extra`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SURGE_")}
    return {**env, **(extra or {})}


def start_surge(
    model: str | Path, log_path: Path, *args: str, env: Mapping[str, str] | None = None, name: str = "surge"
) -> ServerProcess:
    """`surge serve` launched, not yet ready (start several, then `wait_ready` each)."""
    server = ServerProcess(name, surge_argv(model, *args), log_path, env=surge_env(env))
    server.launch()
    return server


@contextlib.contextmanager
def surge_server(
    model: str | Path,
    log_path: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    graceful_stop: bool = True,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> Iterator[ServerProcess]:
    """`surge serve --model MODEL ARGS`, yielded once /ready is 200; stopped by its group after."""
    server = start_surge(model, log_path, *args, env=env)
    try:
        server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop(graceful=graceful_stop)


@contextlib.contextmanager
def surge_servers(
    model: str | Path, log_dir: Path, *argvs: Sequence[str], graceful_stop: bool = True
) -> Iterator[list[ServerProcess]]:
    """One `surge serve` per argument list, started side by side, yielded once all are ready."""
    servers = [start_surge(model, log_dir / f"surge-{i}.log", *argv) for i, argv in enumerate(argvs)]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop(graceful=graceful_stop)
