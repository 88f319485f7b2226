"""The C heap under torch's CPU tensors in the engine's process: what a step frees is kept for the
next step while the engine is busy, and handed back to the system when it falls idle.

Why: torch's CPU allocator is plain malloc, and glibc serves a block larger than its mmap
threshold (128 KiB at first, up to 32 MiB) with a fresh mapping and unmaps it on free. A prefill
step allocates tens of MiB per layer (a 2,048-token chunk's MLP activations are 40-80 MiB in
float32), so every step first-touched fresh pages for them: on a 2-vCPU Xeon VM a 64 MiB tensor
cost 16,384 page faults at every allocation, and turning a 2,048 x 4,864 bfloat16 product into a
new float32 tensor took 10.5-14.7 ms against 1.1 ms into a tensor already touched.

glibc's own tunables do not cure it: with mappings off (MALLOC_MMAP_MAX_=0) the heap grew by the
block at every allocation instead of reusing the freed one (torch asks for aligned blocks, and a
freed block is a little short of the next aligned request), and still faulted. jemalloc with its
decay off (freed pages stay with the allocator: `dirty_decay_ms:-1`) reused them: 0 faults.

So where jemalloc is installed (Debian and Ubuntu's libjemalloc2; the Docker image has it), the
engine's child process is started with it preloaded and decay off (`child_environment`,
models/process/spawn.py); the engine purges its free pages (`give_back`, jemalloc's
`arena.<all>.purge`) whenever it has been idle a moment, the first time right after warmup
(dropping what the load freed), beside the K/V slots' release (models/engine/slot_release.py).
Without jemalloc, glibc's defaults. SURGE_KEEP_HEAP=0, or the user's own LD_PRELOAD or
MALLOC_CONF, leaves the child's allocator alone; an engine on a thread of the server's process
(`--engine-mode thread`) keeps the server's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ENV = "SURGE_KEEP_HEAP"
# Freed pages stay with jemalloc until purged; no background purging thread.
MALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1,background_thread:false"
ALL_ARENAS = 4096  # jemalloc's MALLCTL_ARENAS_ALL


def jemalloc() -> str | None:
    """The jemalloc shared library to preload, by the linker's name for it; None where there is none."""
    if platform.system() != "Linux":
        return None
    return ctypes.util.find_library("jemalloc")


@contextmanager
def child_environment() -> Iterator[None]:
    """While a child process is started: jemalloc preloaded and told to keep what is freed, in the
    environment it inherits (then the parent's environment as it was)."""
    library = None
    if os.environ.get(ENV, "1") != "0" and "LD_PRELOAD" not in os.environ and "MALLOC_CONF" not in os.environ:
        library = jemalloc()
    if library is not None:
        os.environ.update(LD_PRELOAD=library, MALLOC_CONF=MALLOC_CONF)
    try:
        yield
    finally:
        if library is not None:
            os.environ.pop("LD_PRELOAD", None)
            os.environ.pop("MALLOC_CONF", None)


def _mallctl() -> Callable[..., int] | None:
    try:
        function = ctypes.CDLL(None).mallctl
    except AttributeError:  # not jemalloc
        return None
    function.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    function.restype = ctypes.c_int
    mallctl: Callable[..., int] = function
    return mallctl


def is_kept() -> bool:
    """This process runs on jemalloc with decay off (so the engine purges when it falls idle)."""
    return os.environ.get("MALLOC_CONF") == MALLOC_CONF and _mallctl() is not None


def give_back() -> None:
    """Return the allocator's free pages to the system (warm, or idle: nothing runs)."""
    mallctl = _mallctl()
    if mallctl is not None:
        mallctl(f"arena.{ALL_ARENAS}.purge".encode(), None, None, None, 0)
