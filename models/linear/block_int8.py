"""8-bit linear layers with a scale per block of 32, on both operands: llama.cpp's Q8_0 grid, run
by surge's own kernel (models/linear/block_kernel.py, models/linear/kernels/q8_blocks.c) on x86 with AVX-512
VNNI. The other int8 path (models/linear/int8.py, oneDNN) scales per output channel and per token.

Weights: each output channel's row cut into blocks of 32 inputs (the last padded with zeros), each
block symmetric int8 with scale = its largest magnitude / 127. Packed once, in panels of 16
channels: codes shifted by 128 into uint8 (VNNI's dot product takes one operand unsigned),
[panel, block, 8, 16, 4], the 4 consecutive bytes of one channel that it sums into one int32
lane; scales [panel, block, 16]. 1.125 bytes per weight (Q8_0: 1.06 with 16-bit scales; float32: 4).

Activations: quantized by the kernel at each call, per row and per block of 32, the same way.
"""

from __future__ import annotations

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

    def __init__(self, linear: nn.Linear, kernel: BlockKernel) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.padded_in = -(-self.in_features // BLOCK) * BLOCK
        self.kernel = kernel
        self.codes, self.scales = pack_weight(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32 or not rows.is_contiguous():
            rows = rows.float().contiguous()  # bfloat16 models pass through float32
        m = rows.shape[0]
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

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 blocks of {BLOCK}"
