"""Letting go of transformers' mapping of the checkpoint once the model no longer reads from it.

transformers reads a safetensors file through one mapping of the whole file, and a tensor loaded
in the file's dtype is a view of it. Once the linear layers are packed or quantized (copies of
their own) and the embedding reads its own mapping of its table (models/loading/mapped_embedding.py),
what still views the load's mapping is small (norms, biases), yet it keeps the whole mapping
alive, and with it every page the load read: about the file's size of resident memory beside the
model (0.5B shape, bfloat16 + int8: 1,570 MiB resident for 615 MiB of the model's own). Those few
tensors are copied out, the mapping goes with its last view, and the pages with it.

Where most of the model still reads the mapping (a bfloat16 model whose layers stayed torch's
own), nothing is copied: the mapping is the model's memory, as llama.cpp's is.
"""

from __future__ import annotations

import bisect
import logging
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger("surge.loader")

# What may be copied out to free the mapping: a model's norms and biases are a few MiB.
MAX_COPIED = 64 * 2**20


def file_ranges() -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of files (/proc/self/maps), sorted; empty
    where that is not readable (not Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    ranges = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # range, perms, offset, device, inode, path
        if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
            start, _, end = fields[0].partition("-")
            ranges.append((int(start, 16), int(end, 16)))
    return sorted(ranges)


def in_ranges(address: int, ranges: list[tuple[int, int]]) -> bool:
    at = bisect.bisect_right(ranges, (address, float("inf"))) - 1
    return at >= 0 and ranges[at][0] <= address < ranges[at][1]


def copy_out_of_files(model: nn.Module, max_bytes: int = MAX_COPIED) -> int:
    """Copy the parameters and buffers of `model` that view a file mapping into memory of their
    own, where they come to at most `max_bytes`; returns the bytes copied (0: left as they were)."""
    ranges = file_ranges()
    if not ranges:
        return 0
    mapped = [
        tensor
        for tensor in (*model.parameters(), *model.buffers())
        if tensor.device.type == "cpu" and tensor.numel() and in_ranges(tensor.data_ptr(), ranges)
    ]
    size = sum(tensor.numel() * tensor.element_size() for tensor in mapped)
    if not mapped or size > max_bytes:
        return 0
    with torch.no_grad():
        for tensor in mapped:
            tensor.data = tensor.data.clone()
    log.info(
        "checkpoint mapping: %d tensors (%.1f MiB) copied out, so the load's mapping goes", len(mapped), size / 2**20
    )
    return size
