"""The input embedding table read from the checkpoint's own file, mapped, where the loaded model's
table holds the same values.

A float32 model loaded from a bfloat16 checkpoint (what most published checkpoints ship) holds its
embedding table as a float32 copy, 4 bytes a value, for a table a step reads a few rows of; under
`--quantization int8` (float32 activations) every linear layer is 8-bit and that float32 table is
the largest thing left. Once the linear layers are packed or quantized (they keep copies of their
own, a tied output layer's included), the table is replaced by a view of the safetensors file,
mapped read-only, and the rows looked up are widened to the model's dtype on the way out (exact:
bfloat16 and float16 widen to float32 without rounding). Only the pages of tokens seen are
resident, as file pages the kernel may drop and read again; llama.cpp maps its whole file so.
Qwen2.5-0.5B's table (151,936 x 896) is 545 MB in float32, Qwen2.5-1.5B's 933 MB.

A table transformers read in place (a model loaded in the file's dtype, to run in it or wider:
models/loading/widening.py) is mapped afresh the same way: transformers' view of it belongs to a
mapping of the whole checkpoint, which can then go (models/loading/file_pages.py).

Only where it is the same table: the file's tensor is compared with the model's, row block by row
block, before the swap, so a model that scales, pads or resizes its embeddings, or a tied output
layer still reading the model's copy, keeps the copy. `SURGE_MAP_EMBEDDINGS=0` turns it off
(a checkpoint rewritten in place while the server runs would change what the mapping reads).
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from models.loading.file_pages import file_ranges, in_ranges

log = logging.getLogger("surge.loader")

# safetensors' names for the dtypes a table is widened from.
FILE_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
BLOCK_ROWS = 4096  # rows compared at a time: the temporaries stay a few MiB
MAX_HEADER = 100 * 2**20  # safetensors' own bound on its JSON header


@dataclass(frozen=True, slots=True)
class FileTensor:
    """Where a tensor lies in a safetensors file."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # bytes from the file's start


class MappedEmbedding(nn.Module):
    """`nn.Embedding`'s lookup on a table mapped from a file; rows come out in `dtype`."""

    def __init__(self, table: torch.Tensor, dtype: torch.dtype, mapping: mmap.mmap) -> None:
        super().__init__()
        # A plain attribute, not a parameter or buffer: nothing walks, copies or moves it.
        self.table = table
        self.out_dtype = dtype
        self.num_embeddings, self.embedding_dim = table.shape
        self._mapping = mapping  # the table's memory; it lives as long as the module

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(input_ids, self.table).to(self.out_dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, mapped {str(self.table.dtype).removeprefix('torch.')}"


def map_input_embeddings(model: nn.Module, model_dir: str, dtype: torch.dtype | None = None) -> int:
    """Swap `model`'s CPU input embedding for a MappedEmbedding over the same tensor in the
    safetensors under `model_dir`, where it holds the same values; returns the bytes of the
    model's table let go (0: left as it was). `dtype`: what the rows come out in, where the model
    runs wider than it was loaded (models/loading/widening.py); default the table's own."""
    if os.environ.get("SURGE_MAP_EMBEDDINGS", "1") == "0":
        return 0
    embedding = model.get_input_embeddings()  # type: ignore[operator]
    if type(embedding) is not nn.Embedding or embedding.weight.device.type != "cpu":
        return 0
    weight = embedding.weight
    output = model.get_output_embeddings()  # type: ignore[operator]
    output_weight = getattr(output, "weight", None)
    if isinstance(output_weight, torch.Tensor) and output_weight.data_ptr() == weight.data_ptr():
        return 0  # a tied output layer still multiplies by the model's table: nothing to let go
    name = next(name for name, module in model.named_modules() if module is embedding)
    out_dtype = dtype or weight.dtype
    # A table transformers read in place (the file's dtype) is mapped afresh too: its mapping is
    # the whole checkpoint, which can then go once nothing else reads it (models/loading/file_pages.py).
    in_place = in_file_mapping(weight.data_ptr())
    try:  # a saving, never a reason for a load to fail: an unreadable file keeps the copy
        found = find_tensor(Path(model_dir), _names(model, name))
        if found is None or found.shape != tuple(weight.shape):
            return 0
        table, mapping = map_tensor(found)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.info("input embeddings: kept in memory (the checkpoint's table could not be mapped: %s)", exc)
        return 0
    if not same_values(table, weight):
        log.info("input embeddings: the checkpoint's table differs from the model's; kept in memory")
        return 0
    # The comparison touched every page; drop them from this process (the page cache keeps them).
    mapping.madvise(mmap.MADV_DONTNEED)
    _put(model, name, MappedEmbedding(table, out_dtype, mapping))
    freed = 0 if in_place else weight.numel() * weight.element_size()
    log.info(
        "input embeddings: read from %s, mapped (%s, %.0f MiB in the file; %s), rows looked up as %s",
        found.path.name,
        str(found.dtype).removeprefix("torch."),
        table.numel() * table.element_size() / 2**20,
        "was read in place" if in_place else f"{freed / 2**20:.0f} MiB of the model's table freed",
        str(out_dtype).removeprefix("torch."),
    )
    return freed


def _put(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent_name), attribute, module)


def in_file_mapping(address: int) -> bool:
    """Whether `address` lies in a mapping of a file; False where that is not readable (not Linux)."""
    return in_ranges(address, file_ranges())


def _names(model: nn.Module, name: str) -> list[str]:
    """The checkpoint keys the table may be saved under: its name in the model, and without the
    base model's prefix (a checkpoint saved from the bare model)."""
    names = [f"{name}.weight"]
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and name.startswith(prefix + "."):
        names.append(f"{name.removeprefix(prefix + '.')}.weight")
    return names


def find_tensor(model_dir: Path, names: list[str]) -> FileTensor | None:
    """The first of `names` in the directory's safetensors (through its index where sharded)."""
    shards = weight_map(model_dir)
    if shards is not None:
        files = [model_dir / shards[name] for name in names if name in shards][:1]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    for path in files:
        header, data_start = read_header(path)
        for name in names:
            entry = header.get(name)
            if isinstance(entry, dict) and entry.get("dtype") in FILE_DTYPES:
                begin, _ = entry["data_offsets"]
                return FileTensor(path, FILE_DTYPES[entry["dtype"]], tuple(entry["shape"]), data_start + int(begin))
    return None


def weight_map(model_dir: Path) -> dict[str, str] | None:
    """A sharded checkpoint's tensor name -> shard file name; None where it is not sharded."""
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        return None
    shards: dict[str, str] = json.loads(index.read_text()).get("weight_map", {})
    return shards


def read_header(path: Path) -> tuple[dict[str, object], int]:
    """A safetensors file's header (name -> dtype, shape, data_offsets) and where its data starts."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        if length > MAX_HEADER:
            raise ValueError(f"{path}: a safetensors header of {length} bytes")
        header: dict[str, object] = json.loads(file.read(length))
    return header, 8 + length


def map_tensor(tensor: FileTensor) -> tuple[torch.Tensor, mmap.mmap]:
    """`tensor` as a read-only view of its file, and the mapping it lives in."""
    with tensor.path.open("rb") as file:
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():  # "not writable": it never is written
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(mapping, dtype=tensor.dtype, count=math.prod(tensor.shape), offset=tensor.offset)
    return flat.view(tensor.shape), mapping


@torch.inference_mode()
def same_values(table: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `table`, widened to `weight`'s dtype, is `weight`, value for value."""
    for start in range(0, table.shape[0], BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        if not torch.equal(table[rows].to(weight.dtype), weight[rows]):
            return False
    return True
