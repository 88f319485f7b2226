"""GPU figures for metrics, read where CUDA lives: the engine's process.

With the engine in its own process the server never touches CUDA (a context would cost it
hundreds of MiB of GPU memory), so the engine process reads these about once a second and
ships them with its other figures; with the engine on a thread they are read at scrape time.
"""

from __future__ import annotations

import importlib.util
import logging
import sys

log = logging.getLogger("surge.engine")

_HAS_NVML = importlib.util.find_spec("pynvml") is not None

# (device, bytes in use on it by all processes, its bytes in all, busy ratio over NVML's last
# sample or None)
GpuStat = tuple[str, int, int, float | None]


def read_gpu_stats() -> list[GpuStat]:
    """One entry per CUDA device, once this process uses CUDA; [] otherwise (never creates a
    context on an idle GPU). Never raises: a metric must not fail a step or a scrape.

    A process that has not imported torch (the HTTP process beside an engine process) uses no
    CUDA, and must not import torch (seconds and hundreds of MiB) to learn so."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    stats: list[GpuStat] = []
    for index in range(torch.cuda.device_count()):
        try:
            free, total = torch.cuda.mem_get_info(index)
            utilization = torch.cuda.utilization(index) / 100 if _HAS_NVML else None
            stats.append((f"cuda:{index}", total - free, total, utilization))
        except Exception:
            log.debug("could not read GPU %d", index, exc_info=True)
    return stats
