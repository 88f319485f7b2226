"""surge's own int8 kernel (models/linear/kernels/q8_blocks.c): built with the machine's C compiler on
first use, cached, and called through ctypes.

Why a kernel of our own: a scale per block of 32 weights and per block of 32 activations (the
grid of llama.cpp's Q8_0) loses about half as much as one scale per output channel and per token
(docs/bench/llama-server.md), and no CPU op of torch 2.13 nor oneDNN's int8 matmul takes scales
per block.

Where the library comes from, first found first:
1. next to the source, `q8_blocks-<digest>.so`: built into the package by `python -m
   models.linear.block_kernel` (the Docker image does this, so its runtime stage needs no compiler);
2. the cache directory, `$SURGE_KERNEL_CACHE` or `~/.cache/surge/kernels`;
3. built there now with `$CC` (default `cc`): about a second.
The digest covers the source and the compiler flags, so an edited source is never served stale.

The library's OpenMP calls resolve to the libgomp torch has already loaded (same soname), so its
threads are torch's own pool, not a second one competing with it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch  # noqa: F401  (loads torch's libgomp before the kernel's, so the kernel uses it)

log = logging.getLogger("surge.engine")

SOURCE = Path(__file__).with_name("kernels") / "q8_blocks.c"
# -fopenmp: the parallel regions; no -march: the AVX-512 functions carry their own target
# attribute, so the library loads on any x86-64 and q8b_cpu_ok() decides.
CFLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-std=c11")

_P = ctypes.c_void_p
_I = ctypes.c_int


class KernelUnavailable(RuntimeError):
    """The block kernel cannot run here; the message says why (no compiler, not x86 AVX-512 VNNI...)."""


@dataclass(frozen=True)
class BlockKernel:
    """The loaded library's entry point, with its argument types set once."""

    library: ctypes.CDLL
    path: Path

    def __deepcopy__(self, memo: dict[int, object]) -> BlockKernel:
        return self  # one library per process: a copied model's layers share it

    def linear(self, *args: int) -> None:
        """q8b_linear(x, m, k, kp, weight_codes, weight_scales, n, bias, out, codes,
        activation_scales, activation_shifts, threads): pointers and ints, as the C source documents."""
        self.library.q8b_linear(*args)


def digest() -> str:
    """Names the library built from this source with these flags."""
    text = SOURCE.read_bytes() + " ".join(CFLAGS).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def library_name() -> str:
    return f"q8_blocks-{digest()}.so"


def cache_dir() -> Path:
    configured = os.environ.get("SURGE_KERNEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "surge" / "kernels"


def build(target: Path) -> Path:
    """Compile the source into `target` (atomically: a half-written library is never loaded)."""
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C compiler ({compiler!r} not found) to build surge's int8 block kernel")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        done = subprocess.run([compiler, *CFLAGS, "-o", temp, str(SOURCE)], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise KernelUnavailable(f"building the int8 block kernel failed: {done.stderr.strip()[-2000:]}")
        os.replace(temp, target)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return target


def find_or_build() -> Path:
    name = library_name()
    for candidate in (SOURCE.parent / name, cache_dir() / name):
        if candidate.is_file():
            return candidate
    return build(cache_dir() / name)


_loaded: BlockKernel | None = None


def load() -> BlockKernel:
    """The kernel, built if need be; raises KernelUnavailable where it cannot run here."""
    global _loaded
    if _loaded is not None:
        return _loaded
    if os.uname().machine not in ("x86_64", "AMD64"):
        raise KernelUnavailable(f"the int8 block kernel is x86-64 AVX-512 VNNI code; this is {os.uname().machine}")
    path = find_or_build()
    library = ctypes.CDLL(str(path))
    if not library.q8b_cpu_ok():
        raise KernelUnavailable("this CPU lacks AVX-512 VNNI, which the int8 block kernel needs")
    library.q8b_linear.restype = None
    library.q8b_linear.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _P, _P, _P, _P, _I]
    _loaded = BlockKernel(library, path)
    return _loaded


def main() -> None:
    """Build the library next to the source (for an image whose runtime has no compiler)."""
    path = build(SOURCE.parent / library_name())
    print(path)


if __name__ == "__main__":
    main()
