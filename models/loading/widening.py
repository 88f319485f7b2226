"""A CPU model that runs in float32 from a bfloat16 or float16 checkpoint, loaded in the file's
dtype and widened one layer at a time, as each is packed or quantized.

What most published checkpoints ship is bfloat16; a CPU without bf16 matmul units runs float32,
and `--quantization int8` quantizes from float32. Loaded in float32, every weight becomes a
converted copy at once, and the load's peak is the whole float32 model plus the layer being
packed beside it (the vocabulary projection, a tied output layer's table kept for the embedding:
0.5B shape 2.5 GiB). Loaded in the file's dtype (read in place from the file's mapping where the
dtypes match), then each linear layer widened as it is packed (models/linear/packed.py) or
quantized from its bfloat16 rows (models/linear/block_int8.py), the embedding read from the file
and widened per row (models/loading/mapped_embedding.py), and what is left (norms) widened last,
the peak is about the float32 model the server keeps, or the bf16 model itself under int8.

Exact: bfloat16 and float16 widen to float32 without rounding, so every weight is the value the
float32 load reads. What is not read from the checkpoint is not widened from a narrow value: a
buffer computed when the model is built (rotary frequencies) is computed under the load's
default dtype, so a narrow load that leaves any floating buffer in the narrow dtype is discarded
and the model loaded in float32 as before. `SURGE_NARROW_LOAD=0` turns it off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from models.linear.packed import EXACT_WIDENING
from models.loading.mapped_embedding import FILE_DTYPES, read_header, weight_map


def load_dtype(model_dir: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype to read the weights in: the checkpoint's own where the model runs wider and the
    widening is exact (CPU only: a GPU's weights go straight to the device), else `dtype`."""
    if device.type != "cpu" or os.environ.get("SURGE_NARROW_LOAD", "1") == "0":
        return dtype
    try:
        if _quantized(Path(model_dir)):  # its own dtypes and loader: read as asked
            return dtype
        stored = checkpoint_dtype(Path(model_dir))
    except (OSError, ValueError, KeyError, TypeError):  # unreadable: the plain load reports it
        return dtype
    return stored if stored is not None and (stored, dtype) in EXACT_WIDENING else dtype


def checkpoint_dtype(model_dir: Path) -> torch.dtype | None:
    """The one floating dtype of the directory's safetensors tensors; None where there are none,
    or several (a checkpoint that keeps some tensors wider keeps them so for a reason)."""
    shards = weight_map(model_dir)
    if shards is not None:
        files = sorted({model_dir / name for name in shards.values()})
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    found: set[str] = set()
    for path in files:
        header, _ = read_header(path)
        dtypes = (str(entry.get("dtype", "")) for entry in header.values() if isinstance(entry, dict))
        found |= {dtype for dtype in dtypes if dtype.startswith(("F", "BF"))}  # F16, BF16, F32, F8_...
    if len(found) != 1:
        return None
    return FILE_DTYPES.get(found.pop())


def _quantized(model_dir: Path) -> bool:
    """A checkpoint quantized by a method transformers loads itself (GPTQ, AWQ, FP8, ...)."""
    config = model_dir / "config.json"
    return config.is_file() and "quantization_config" in json.loads(config.read_text())


def narrow_buffers(model: nn.Module, dtype: torch.dtype) -> list[str]:
    """The floating buffers of a narrow-loaded model that are not in `dtype`: computed at build
    time in the narrow dtype (or read so), they would not be what a `dtype` load computes."""
    return [name for name, buffer in model.named_buffers() if buffer.is_floating_point() and buffer.dtype != dtype]


def widen(model: nn.Module, dtype: torch.dtype) -> None:
    """What is left in the narrow dtype once the linear layers and the embedding are done (norms;
    linear layers that stayed torch's own), to `dtype`, one tensor at a time; the config says so."""
    model.to(dtype)
    config = getattr(model, "config", None)
    if config is not None:
        config.dtype = dtype
