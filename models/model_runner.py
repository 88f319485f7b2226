"""The model runner: turns a scheduled step into forward passes over the slot cache.

It speaks only slots, positions and token ids; it knows nothing of requests, sampling or
HTTP. Two forward passes per step at most:
- prefill: prompt chunks, left-padded into (B, T) so every row's last real token sits in
  the final column and one logits row per sequence comes back;
- decode: one token for each of the slots [0, num_slots), in one contiguous block of the
  cache. Slots still prefilling ride along as padding rows writing to the scratch column.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

import torch
from transformers import PreTrainedModel

from models.kv_cache import SlotCache, StepPlan
from models.scheduler import PrefillChunk, SlotMove
from models.sequence import Sequence


class Runner(Protocol):
    """What the engine asks of a runner: this module's `ModelRunner`, or `models.echo.EchoRunner`."""

    device: torch.device

    def apply_moves(self, moves: Seq[SlotMove]) -> None: ...

    def prefill(self, chunks: Seq[PrefillChunk]) -> torch.Tensor: ...

    def decode(self, num_slots: int, seqs: Seq[Sequence]) -> torch.Tensor: ...


class ModelRunner:
    def __init__(self, model: PreTrainedModel, max_num_seqs: int, max_model_len: int) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        config = model.config.get_text_config()
        self.cache = SlotCache(config.num_hidden_layers, max_num_seqs, max_model_len)
        self.max_model_len = max_model_len
        self._mask_min = torch.finfo(self.dtype).min
        self._sliding_window, self._mixed_layers = _sliding_layout(config)

    @torch.inference_mode()
    def apply_moves(self, moves: Seq[SlotMove]) -> None:
        for move in moves:
            self.cache.move(move.src, move.dst, move.num_tokens)

    @torch.inference_mode()
    def prefill(self, chunks: Seq[PrefillChunk]) -> torch.Tensor:
        """Compute the chunks' K/V; return last-position logits, (len(chunks), V) float32."""
        width = max(chunk.num_tokens for chunk in chunks)
        read_len = max(chunk.start + chunk.num_tokens for chunk in chunks)
        self.cache.ensure_capacity(read_len)
        scratch = self.cache.scratch_pos
        input_ids, positions, write_pos = [], [], []
        for chunk in chunks:
            pad = width - chunk.num_tokens
            end = chunk.start + chunk.num_tokens
            input_ids.append([0] * pad + chunk.seq.prompt_token_ids[chunk.start : end])
            real = list(range(chunk.start, end))
            positions.append([0] * pad + real)
            write_pos.append([scratch] * pad + real)
        pos = torch.tensor(positions, device=self.device)  # (B, T)
        # A padding query may look at position 0 only: any row it reads is finite, never NaN.
        pad_mask = torch.tensor([[True] * (width - c.num_tokens) + [False] * c.num_tokens for c in chunks])
        plan = StepPlan(
            write_pos=torch.tensor(write_pos, device=self.device),
            read_len=read_len,
            slots=torch.tensor([c.seq.slot for c in chunks], device=self.device),
        )
        return self._forward(torch.tensor(input_ids, device=self.device), pos, pad_mask.to(self.device), plan)

    @torch.inference_mode()
    def decode(self, num_slots: int, seqs: Seq[Sequence]) -> torch.Tensor:
        """One token for each decoding sequence; return logits (len(seqs), V) float32 in seqs order."""
        read_len = max(seq.num_computed_tokens for seq in seqs) + 1
        self.cache.ensure_capacity(read_len)
        scratch = self.cache.scratch_pos
        input_ids = [0] * num_slots
        positions = [0] * num_slots
        write_pos = [scratch] * num_slots
        is_pad = [True] * num_slots
        for seq in seqs:
            input_ids[seq.slot] = seq.last_token_id
            positions[seq.slot] = write_pos[seq.slot] = seq.num_computed_tokens
            is_pad[seq.slot] = False
        pos = torch.tensor(positions, device=self.device)[:, None]  # (B, 1)
        pad = torch.tensor(is_pad, device=self.device)[:, None]  # (B, 1)
        plan = StepPlan(write_pos=torch.tensor(write_pos, device=self.device), read_len=read_len, num_rows=num_slots)
        logits = self._forward(torch.tensor(input_ids, device=self.device)[:, None], pos, pad, plan)
        if len(seqs) == num_slots and all(seq.slot == i for i, seq in enumerate(seqs)):
            return logits
        return logits[torch.tensor([seq.slot for seq in seqs], device=self.device)]

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, is_pad: torch.Tensor, plan: StepPlan
    ) -> torch.Tensor:
        self.cache.plan = plan
        try:
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                attention_mask=self._mask(positions, is_pad, plan.read_len),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        finally:
            self.cache.plan = None
        return out.logits[:, -1].float()  # (B, V)

    def _mask(
        self, positions: torch.Tensor, is_pad: torch.Tensor, read_len: int
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive 4D masks (B, 1, T, read_len): a query at position p sees keys at positions <= p."""
        keys = torch.arange(read_len, device=self.device)  # (L,)
        causal = keys[None, None, :] <= positions[:, :, None]  # (B, T, L)
        causal = torch.where(is_pad[:, :, None], keys[None, None, :] == 0, causal)
        full = self._additive(causal)
        if self._sliding_window is None:
            return full
        in_window = keys[None, None, :] > positions[:, :, None] - self._sliding_window
        sliding = self._additive(causal & (in_window | is_pad[:, :, None]))
        if self._mixed_layers:
            return {"full_attention": full, "sliding_attention": sliding}
        return sliding

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~allowed, self._mask_min)[:, None]  # (B, 1, T, L)


def _sliding_layout(config: object) -> tuple[int | None, bool]:
    """(window, mixed): the sliding window if any layer uses one, and whether others do not."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        kinds = set(layer_types)
        if "sliding_attention" not in kinds:
            return None, False
        return window, len(kinds) > 1
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None, False
    return window, False
