"""Off-by-default memory diagnostics: tracemalloc's top allocation sites on SIGUSR1.

    SURGE_TRACEMALLOC=1 surge serve ...            # start tracing (N > 1: keep N frames per site)
    kill -USR1 <pid>                               # write the top sites to a file, log where

Nothing happens unless `SURGE_TRACEMALLOC` is set to a positive number: tracing costs memory and
slows every allocation, so it is a debugging aid for soak tests and leak hunts, never a setting
of a normal deployment (it is deliberately not a `surge serve` flag).

Each SIGUSR1 writes `surge-tracemalloc-<role>-<pid>.txt` in `SURGE_TRACEMALLOC_DIR` (default:
the system temp directory), replacing the previous dump atomically: a header line with the dump
number, the traced memory, the top `SURGE_TRACEMALLOC_TOP` (default 15) sites by size, and the top
sites by growth since the first dump (the baseline). `role` is `server` for the HTTP process and
`engine` for the engine's child process (`--engine-mode process`), which is traced too: its init
runs `engine_process_init`, so send SIGUSR1 to both pids to see both sides.
NOTE: SIGUSR1 kills a process that has not installed the handler; only signal a surge started
with SURGE_TRACEMALLOC set. Must not know FastAPI or the engine.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from app.ops.logs import configure_logging

log = logging.getLogger("surge.diagnostics")

ENABLE_ENV = "SURGE_TRACEMALLOC"
DIR_ENV = "SURGE_TRACEMALLOC_DIR"
TOP_ENV = "SURGE_TRACEMALLOC_TOP"
DEFAULT_TOP = 15
HEADER_PREFIX = "# surge tracemalloc dump "


def tracemalloc_frames(environ: Mapping[str, str] = os.environ) -> int:
    """Frames per traced allocation asked for by `SURGE_TRACEMALLOC`; 0 = off."""
    raw = environ.get(ENABLE_ENV, "").strip()
    if not raw:
        return 0
    try:
        frames = int(raw)
    except ValueError:
        raise ValueError(f"{ENABLE_ENV} must be a whole number of frames (1 = on), got {raw!r}") from None
    return max(0, frames)


def dump_path(role: str, pid: int | None = None, environ: Mapping[str, str] = os.environ) -> Path:
    directory = Path(environ.get(DIR_ENV) or tempfile.gettempdir())
    return directory / f"surge-tracemalloc-{role}-{os.getpid() if pid is None else pid}.txt"


class TracemallocDumper:
    """Writes the top allocation sites of this process; the first dump is the growth baseline."""

    def __init__(self, role: str, path: Path, top: int = DEFAULT_TOP) -> None:
        self.role = role
        self.path = path
        self.top = top
        self.num_dumps = 0
        self._baseline: tracemalloc.Snapshot | None = None

    def dump(self) -> Path:
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (
                tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            )
        )
        current, peak = tracemalloc.get_traced_memory()
        self.num_dumps += 1
        lines = [
            f"{HEADER_PREFIX}{self.num_dumps} role={self.role} pid={os.getpid()} time={time.time():.3f} "
            f"traced_bytes={current} peak_bytes={peak}",
            f"## top {self.top} allocation sites by size",
        ]
        lines += [
            _stat_line(stat.size, stat.count, stat.traceback) for stat in snapshot.statistics("lineno")[: self.top]
        ]
        if self._baseline is None:
            self._baseline = snapshot
        else:
            lines.append(f"## top {self.top} allocation sites by growth since dump 1")
            diffs = snapshot.compare_to(self._baseline, "lineno")[: self.top]
            lines += [_diff_line(diff.size_diff, diff.count_diff, diff.traceback) for diff in diffs]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        partial.write_text("\n".join(lines) + "\n")
        partial.replace(self.path)  # readers never see half a dump
        return self.path


def _stat_line(size: int, count: int, traceback: tracemalloc.Traceback) -> str:
    return f"{size / 1024:10.1f} KiB {count:8d} blocks  {_where(traceback)}"


def _diff_line(size_diff: int, count_diff: int, traceback: tracemalloc.Traceback) -> str:
    return f"{size_diff / 1024:+10.1f} KiB {count_diff:+8d} blocks  {_where(traceback)}"


def _where(traceback: tracemalloc.Traceback) -> str:
    return " <- ".join(f"{frame.filename}:{frame.lineno}" for frame in traceback)


def install_tracemalloc(role: str) -> TracemallocDumper | None:
    """Start tracing and dump on SIGUSR1 when SURGE_TRACEMALLOC asks for it; else do nothing.

    Call from the process's main thread (signal handlers can only be set there)."""
    frames = tracemalloc_frames()
    if not frames:
        return None
    top = int(os.environ.get(TOP_ENV) or DEFAULT_TOP)
    dumper = TracemallocDumper(role, dump_path(role), top=top)
    tracemalloc.start(frames)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        try:
            path = dumper.dump()
        except Exception:  # a diagnostic must never take the server down
            log.exception("tracemalloc dump failed")
            return
        log.warning("tracemalloc: wrote dump %d of the %s process to %s", dumper.num_dumps, role, path)

    signal.signal(signal.SIGUSR1, on_signal)
    log.warning("tracemalloc is on (%d frame(s)) in the %s process: SIGUSR1 writes %s", frames, role, dumper.path)
    return dumper


def _init_then_trace(init: Callable[[], None], role: str) -> None:
    init()
    install_tracemalloc(role)


def engine_process_init(log_level: str, log_format: str, role: str = "engine") -> Callable[[], None]:
    """A child process's init (picklable; the engine's, or the embedding model's with its own
    `role`): logging as the server's (same level, format and stream), then
    `install_tracemalloc(role)` (with SURGE_TRACEMALLOC set, it is traced too)."""
    return functools.partial(_init_then_trace, functools.partial(configure_logging, log_level, log_format), role)
