"""8-bit linear layers with a scale per block of 32, on both operands: llama.cpp's Q8_0 grid, run
by surge's own kernel (models/linear/block_kernel.py, models/linear/kernels/q8_blocks.c) on x86 with AVX-512
VNNI. The other int8 path (models/linear/int8.py, oneDNN) scales per output channel and per token.

Weights: each output channel's row cut into blocks of 32 inputs (the last padded with zeros), each
block symmetric int8 with scale = its largest magnitude / 127. Packed once, in panels of 16
channels: codes shifted by 128 into uint8 (VNNI's dot product takes one operand unsigned),
[panel, block, 8, 16, 4], the 4 consecutive bytes of one channel that it sums into one int32
lane; scales [panel, block, 16]. 1.125 bytes per weight (Q8_0: 1.06 with 16-bit scales; float32: 4).

Activations: quantized by the kernel at each call, per row and per block of 32, the same way.

Prefills on AMX: where bfloat16 products run on AMX tiles (models/linear/amx.py), a call of
TILE_ROWS rows or more takes the weight back to bfloat16 (the kernel's q8b_dequant_bf16) and
multiplies on the tiles instead: 1.5-1.8x the VNNI kernel from 512 rows.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from models.linear.block_kernel import BlockKernel

BLOCK = 32
PANEL = 16
QMAX = 127


# Output channels quantized at a time: the float32 temporaries of one chunk (a few of its size)
# stay tens of MiB however large the layer. NOTE: whole, a 151,936 x 896 vocabulary projection's
# three temporaries of 545 MB each raised a 0.5B model's peak memory at load by 1.8 GB.
CHUNK_ELEMENTS = 1 << 22


def pack_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of a float weight (out x in) in the kernel's layout."""
    out_features, in_features = weight.shape
    kp = -(-in_features // BLOCK) * BLOCK
    panels = -(-out_features // PANEL)
    nb = kp // BLOCK
    rows = panels * PANEL
    codes = torch.empty(rows, kp, dtype=torch.uint8)
    scales = torch.empty(rows, nb)
    step = max(PANEL, CHUNK_ELEMENTS // kp // PANEL * PANEL)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        padded = weight.new_zeros(stop - start, kp, dtype=torch.float32)
        real = max(0, min(stop, out_features) - start)
        padded[:real, :in_features] = weight[start : start + real].float()
        blocks = padded.view(stop - start, nb, BLOCK)
        chunk_scales = blocks.abs().amax(dim=2) / QMAX
        chunk = torch.round(blocks / chunk_scales.clamp_min(torch.finfo(torch.float32).tiny)[..., None])
        codes[start:stop] = chunk.clamp_(-QMAX, QMAX).add_(128).to(torch.uint8).view(stop - start, kp)
        scales[start:stop] = chunk_scales
    packed = codes.view(panels, PANEL, nb, BLOCK // 4, 4).permute(0, 2, 3, 1, 4).contiguous()
    return packed, scales.view(panels, PANEL, nb).permute(0, 2, 1).contiguous()


class BlockInt8Linear(nn.Module):
    """`nn.Linear`'s forward on int8 weights and activations with a scale per block of 32."""

    def __init__(self, linear: nn.Linear, kernel: BlockKernel, tile_rows: int | None = None) -> None:
        """tile_rows: from this many rows up, the product runs on bfloat16 tiles (see `_tiles`);
        None: never."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.padded_in = -(-self.in_features // BLOCK) * BLOCK
        self.kernel = kernel
        self.tile_rows = tile_rows
        self.codes, self.scales = pack_weight(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        m = rows.shape[0]
        if self.tile_rows is not None and m >= self.tile_rows:
            return self._tiles(rows).reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        if rows.dtype != torch.float32 or not rows.is_contiguous():
            rows = rows.float().contiguous()  # bfloat16 models pass through float32
        out = torch.empty(m, self.out_features)
        if m:
            codes = torch.empty(m, self.padded_in, dtype=torch.int8)
            blocks = self.padded_in // BLOCK
            act_scales, act_shifts = torch.empty(m, blocks), torch.empty(m, blocks, dtype=torch.int32)
            self.kernel.linear(
                rows.data_ptr(), m, self.in_features, self.padded_in,
                self.codes.data_ptr(), self.scales.data_ptr(), self.out_features,
                0 if self.bias is None else self.bias.data_ptr(), out.data_ptr(),
                codes.data_ptr(), act_scales.data_ptr(), act_shifts.data_ptr(), torch.get_num_threads(),
            )  # fmt: skip
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def _tiles(self, rows: torch.Tensor) -> torch.Tensor:
        """A prefill's product on AMX: the weight back in bfloat16 (one pass over its 1.125 bytes a
        weight, in slices of output channels so the copy stays a few MiB), times the rows in
        bfloat16 through oneDNN, which runs it on AMX tiles (TILE_ROWS has the timings). The
        activations keep 8 bits of mantissa against the kernel's int8 codes per block of 32: the
        product was closer to float32's (relative error 0.0047 against 0.0065 on a random layer).
        The rows below TILE_ROWS (decodes) run the kernel, so a prompt's prefill and its decode
        steps round differently, as they do between any two kernels."""
        m = rows.shape[0]
        xb = rows.to(torch.bfloat16).contiguous()
        out = torch.empty(m, self.out_features)
        width = min(self.out_features, TILE_SLICE_CHANNELS)
        # Both slices from this thread's scratch: fresh tensors of tens of MiB cost their page
        # faults at every call (a 2,048 x 4,864 bfloat16 product's .float() took 9 ms, a copy into
        # a float32 tensor 1.1 ms).
        scratch = _scratch(width * self.in_features + m * width)
        threads = torch.get_num_threads()
        for start in range(0, self.out_features, TILE_SLICE_CHANNELS):
            width = min(TILE_SLICE_CHANNELS, self.out_features - start)
            weight = scratch[: width * self.in_features].view(width, self.in_features)
            product = scratch[width * self.in_features : width * self.in_features + m * width].view(m, width)
            panel = start // PANEL
            self.kernel.dequant_bf16(
                self.codes[panel].data_ptr(), self.scales[panel].data_ptr(),
                width, self.in_features, self.padded_in, weight.data_ptr(), threads,
            )  # fmt: skip
            torch.mm(xb, weight.t(), out=product)
            if width == self.out_features:
                out.copy_(product)
            else:
                out[:, start : start + width].copy_(product)
        if self.bias is not None:
            out += self.bias
        return out

    def extra_repr(self) -> str:
        tiles = "" if self.tile_rows is None else f", bfloat16 tiles from {self.tile_rows} rows"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 blocks of {BLOCK}{tiles}"


# Output channels dequantized at a time on the tile path (a multiple of PANEL): 4,096 x a hidden
# size of 896-4,096 is 7-32 MiB of bfloat16, so a model's wide layers (the vocabulary projection,
# 151,936 channels) never need a copy of their whole weight.
TILE_SLICE_CHANNELS = 4096
# From how many rows the tile path runs, where it may (models/linear/amx.py). Measured on a 2-vCPU
# Intel Xeon VM with AMX, both cores, 896 x 4,864 and 4,864 x 896 layers, ms for VNNI's kernel against
# the tiles with their dequantization: 128 rows 1.2-1.3 / 1.6-1.7, 192 1.7-1.9 / 1.9, 256
# 2.3-2.5 / 2.0-2.1, 512 4.6-5.3 / 3.0-3.5, 2,048 22-28 / 12.6-19. Fewer rows (decode) read the
# weights' int8 bytes once for little arithmetic, which is VNNI's strength.
TILE_ROWS = 256

_local = threading.local()


def _scratch(elements: int) -> torch.Tensor:
    """This thread's bfloat16 scratch of at least `elements` (one engine thread: one buffer for
    every layer, grown to the largest slice)."""
    buffer: torch.Tensor | None = getattr(_local, "buffer", None)
    if buffer is None or buffer.numel() < elements:
        buffer = _local.buffer = torch.empty(elements, dtype=torch.bfloat16)
    return buffer
