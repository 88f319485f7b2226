"""Whether bfloat16 matmuls run on AMX tiles here, safely: the CPU advertises AMX-BF16, and one
such product, run in a child process, gives float32's answer to bfloat16's rounding.

Why a child: flags are not proof. On a 2-core Sapphire Rapids VM llama.cpp's AMX path died with
SIGILL although the CPU advertised AMX (the OS must also grant the tile state to the process);
oneDNN asks for it and falls back when refused, but a fault in the child costs the check, not
the server. Asked once a process (~2 s: the child imports torch); `SURGE_INT8_ISA`, which caps
the int8 kernel by hand, turns the tiles off too.
"""

from __future__ import annotations

import functools
import logging
import os

from models.runner.cpus import ChildFailed, CpuFeatures, cpu_features, run_in_child

log = logging.getLogger("surge.engine")

PROBE_TIMEOUT_S = 120.0
MAX_ERROR = 0.02  # relative, of the bfloat16 product against float32's (bfloat16 keeps 8 bits)

# A product large enough that oneDNN takes its AMX kernel (it does from a few dozen rows).
_PROBE = r"""
import torch
torch.manual_seed(0)
a, b = torch.randn(256, 512), torch.randn(512, 384)
want = a @ b
got = (a.bfloat16() @ b.bfloat16()).float()
print(float((got - want).norm() / want.norm()))
"""


@functools.cache
def bf16_tiles() -> bool:
    """True where this process may multiply bfloat16 on AMX tiles (see the module's docstring)."""
    return check_bf16_tiles(cpu_features(), "SURGE_INT8_ISA" in os.environ)


def check_bf16_tiles(features: CpuFeatures, capped: bool) -> bool:
    """The check itself, uncached: the flags, then the product in a child process."""
    if capped or not ({"amx_tile", "amx_bf16"} <= features.flags):
        return False
    done = run_in_child(_PROBE, [], PROBE_TIMEOUT_S)
    if isinstance(done, ChildFailed):
        log.warning("AMX: %s advertises AMX-BF16, but a bfloat16 product %s; not used", features.summary(), done.why)
        return False
    try:
        error = float(done.strip().splitlines()[-1])
    except (ValueError, IndexError):
        log.warning("AMX: the bfloat16 probe printed %r; not used", done[-200:])
        return False
    if not error <= MAX_ERROR:
        log.warning("AMX: the bfloat16 probe's product was off by %.3f (relative); not used", error)
        return False
    return True
