"""Row counts rounded up to a fixed set of sizes before oneDNN's kernels see them.

oneDNN builds a primitive for every input shape it is handed and keeps it in a cache (capped at 64
entries by `models/runner/cpus.py`). A server hands it every row count there is: each decode batch
size, each mix of prompt chunks. Measured on a 2-core AMD EPYC (AVX2), a packed model fed row
counts 1-400 grew by 67 MiB and went on growing after the cap was full (freed primitives of every
size leave the heap fragmented), enough to fail the soak's 5% bound. Rounded up to these sizes,
the same feed grew by 19 MiB and not at all the second time through.

The sizes: multiples of 8 up to 64, then 8 per doubling (72, 80, ... 128, 144, ... 256, 288 ...),
so a step computes at most 12.5% more rows than it has beyond 64 rows, and at most 7 more below;
48 sizes cover 1-2,048 rows. The padding rows are zeros (or the zero point of int8 codes), and
their outputs are dropped.
"""

from __future__ import annotations

import torch

SMALL = 64  # up to here, multiples of SMALL_STEP
SMALL_STEP = 8


def bucket_rows(rows: int) -> int:
    """The size `rows` rows are computed as."""
    if rows <= SMALL:
        return -(-rows // SMALL_STEP) * SMALL_STEP
    step = 1 << (rows.bit_length() - 4)  # rows in [2^k, 2^(k+1)): steps of 2^(k-3), 8 per doubling
    return -(-rows // step) * step


def pad_rows(x: torch.Tensor, fill: float = 0) -> torch.Tensor:
    """`x` (rows x features) with `fill` rows appended up to bucket_rows; `x` itself if none are."""
    rows = x.shape[0]
    size = bucket_rows(rows)
    if size == rows:
        return x
    out = x.new_empty(size, x.shape[1])
    out[:rows].copy_(x)
    out[rows:].fill_(fill)
    return out
