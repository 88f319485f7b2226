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

Which entry point runs: AVX-512 VNNI where the CPU has it, else AVX2 (both give the same integers,
bit for bit), else none (the caller falls back to oneDNN). CPUID flags are not proof that an
instruction runs: on a 2-core Sapphire Rapids VM llama.cpp's AMX path dies with SIGILL although
the CPU advertises AMX. So the chosen entry point is first run in a child process on a product
whose answer is known exactly (`probe`, ~50 ms, no torch): a crash or a wrong sum moves to the next
one down, with a WARNING. `SURGE_INT8_ISA=avx2` (or `none`) caps the choice by hand.
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

from models.runner.cpus import ChildFailed, run_in_child

log = logging.getLogger("surge.engine")

SOURCE = Path(__file__).with_name("kernels") / "q8_blocks.c"
# -fopenmp: the parallel regions; no -march: the vector functions carry their own target
# attributes, so the library loads on any x86-64 and q8b_isa() says which may run.
CFLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-std=c11")
LIBS = ("-lm",)
# The entry points by instruction set, best first, as q8b_isa() numbers them (2, 1).
ISAS = {"avx512-vnni": ("q8b_linear", 2), "avx2": ("q8b_linear_avx2", 1)}
PROBE_TIMEOUT_S = 30.0

_P = ctypes.c_void_p
_I = ctypes.c_int


class KernelUnavailable(RuntimeError):
    """The block kernel cannot run here; the message says why (no compiler, not x86 AVX-512 VNNI...)."""


@dataclass(frozen=True)
class BlockKernel:
    """The loaded library's entry point, with its argument types set once."""

    library: ctypes.CDLL
    path: Path
    isa: str = "avx512-vnni"  # a key of ISAS: which entry point `linear` calls

    def __deepcopy__(self, memo: dict[int, object]) -> BlockKernel:
        return self  # one library per process: a copied model's layers share it

    def linear(self, *args: int) -> None:
        """q8b_linear(x, m, k, kp, weight_codes, weight_scales, n, bias, out, codes,
        activation_scales, activation_shifts, threads): pointers and ints, as the C source documents."""
        getattr(self.library, ISAS[self.isa][0])(*args)  # ctypes caches the function on the library

    def dequant_bf16(self, *args: int) -> None:
        """q8b_dequant_bf16(weight_codes, weight_scales, n, k, kp, out, threads): the packed weight
        as a bfloat16 n x k matrix (out), for prefills through AMX (models/linear/block_int8.py);
        AVX-512 on the VNNI entry point's CPUs, a plain loop on the others (the same bits)."""
        self.library.q8b_dequant_bf16(*args, int(self.isa == "avx512-vnni"))


def digest() -> str:
    """Names the library built from this source with these flags."""
    text = SOURCE.read_bytes() + " ".join(CFLAGS + LIBS).encode()
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
        done = subprocess.run(
            [compiler, *CFLAGS, "-o", temp, str(SOURCE), *LIBS], capture_output=True, text=True, timeout=300
        )
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


# Runs one entry point of the library at argv[1] on a known product; prints the outputs. No torch:
# the weights' codes are one value per (panel, block), so no packing is needed to know the answer.
_PROBE = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
entry = getattr(lib, sys.argv[2])
m, k, n = 3, 64, 20  # two blocks, two panels (the second partial), an odd row
x = (ctypes.c_float * (m * k))(*[(1.0 if (i % 3) else -1.0) * (1 + r) for r in range(m) for i in range(k)])
codes = (ctypes.c_uint8 * (2 * 2 * 512))()
for panel in range(2):
    for block in range(2):
        for i in range(512):
            codes[(panel * 2 + block) * 512 + i] = 128 + (1 if block == 0 else -2)
scales = (ctypes.c_float * (2 * 2 * 16))(*([1.0] * 64))
out = (ctypes.c_float * (m * n))()
xq, xs, xc = (ctypes.c_int8 * (m * k))(), (ctypes.c_float * (m * 2))(), (ctypes.c_int32 * (m * 2))()
entry(x, m, k, k, codes, scales, n, None, out, xq, xs, xc, 1)
print(" ".join(repr(v) for v in out))
"""


def probe_answer() -> list[float]:
    """What _PROBE must print: each row r is (1 + r) x (the first block's sum - 2 x the second's)."""
    block = [1.0 if i % 3 else -1.0 for i in range(32)]
    first, second = sum(block), sum(1.0 if (i + 32) % 3 else -1.0 for i in range(32))
    return [(1 + r) * (first - 2 * second) for r in range(3) for _ in range(20)]


def probe(path: Path, isa: str) -> str | None:
    """Run `isa`'s entry point of the library in a child process; None if it gave the exact
    answer, else what went wrong (a signal, an exit status, a wrong sum)."""
    done = run_in_child(_PROBE, [str(path), ISAS[isa][0]], PROBE_TIMEOUT_S)
    if isinstance(done, ChildFailed):
        return f"the probe {done.why}"
    try:
        got = [float(v) for v in done.split()]
    except ValueError:
        return f"the probe printed {done[:200]!r}"
    return None if got == probe_answer() else "the probe's sums were wrong"


_loaded: dict[str, BlockKernel] = {}


def usable_isas(library: ctypes.CDLL) -> list[str]:
    """The entry points this CPU advertises the instructions for, best first, capped by
    SURGE_INT8_ISA."""
    level = int(library.q8b_isa())
    isas = [name for name, (_, needs) in ISAS.items() if needs <= level]
    cap = os.environ.get("SURGE_INT8_ISA", "").strip().lower()
    if cap == "none":
        return []
    if cap in ISAS:
        isas = isas[isas.index(cap) :] if cap in isas else []
    return isas


def load(isa: str | None = None) -> BlockKernel:
    """The kernel, built if need be, on the best entry point that passes its probe here (or on
    `isa` exactly); raises KernelUnavailable where none can run."""
    key = f"{isa or ''}|{os.environ.get('SURGE_INT8_ISA', '')}"
    if key in _loaded:
        return _loaded[key]
    if os.uname().machine not in ("x86_64", "AMD64"):
        raise KernelUnavailable(
            f"the int8 block kernel is x86-64 code (AVX-512 VNNI or AVX2); this is {os.uname().machine}"
        )
    path = find_or_build()
    library = ctypes.CDLL(str(path))
    for entry, _ in ISAS.values():
        function = getattr(library, entry)
        function.restype = None
        function.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _P, _P, _P, _P, _I]
    library.q8b_dequant_bf16.restype = None
    library.q8b_dequant_bf16.argtypes = [_P, _P, _I, _I, _I, _P, _I, _I]
    candidates = usable_isas(library)
    if isa is not None:
        if isa not in candidates:
            raise KernelUnavailable(f"the int8 block kernel's {isa} path cannot run on this CPU (usable: {candidates})")
        candidates = [isa]
    if not candidates:
        raise KernelUnavailable(
            "this CPU has neither AVX-512 VNNI nor AVX2 (or SURGE_INT8_ISA says none), "
            "which the int8 block kernel needs"
        )
    failures: list[str] = []
    for name in candidates:
        failure = probe(path, name)
        if failure is None:
            if failures:
                log.warning("int8 block kernel: %s", "; ".join(failures))
            _loaded[key] = BlockKernel(library, path, name)
            return _loaded[key]
        failures.append(f"the {name} path failed its probe ({failure})")
    raise KernelUnavailable("; ".join(failures))


def main() -> None:
    """Build the library next to the source (for an image whose runtime has no compiler)."""
    path = build(SOURCE.parent / library_name())
    print(path)


if __name__ == "__main__":
    main()
