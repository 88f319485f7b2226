"""The model runner: turns a scheduled step into forward passes over the slot cache.

It speaks only slots, positions and token ids; it knows nothing of requests, sampling or
HTTP. One forward pass per step where the model lets us (packed), two otherwise (split):
- packed: every token of the step in one (1, N) row, as vLLM flattens a batch: first the
  decode block (token i is slot i's next token; slots still prefilling ride along as
  padding that writes to the scratch column), then each prompt chunk's tokens. A custom
  attention function (registered with transformers' AttentionInterface) attends the decode
  block against the contiguous slot block and each chunk against its own slot, all views of
  the cache. On a small model a forward costs mostly transformers' per-module Python
  whatever its token count, so folding the prefill into the decode forward saves nearly a
  whole forward on every step that admits a request;
- split (a model whose attention does not go through AttentionInterface, or not through
  SDPA): prompt chunks left-padded into (B, T) so every row's last real token sits in the
  final column, then the decode block as (B, 1).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq

import torch
from transformers import AttentionInterface, PreTrainedModel

from models.kv.cache import ChunkRows, SlotCache, StepPlan, reserves
from models.kv.pool import KVPool
from models.runner.attention import (
    ACTIVE,
    HALF_DTYPES,
    PACKED_ATTENTION,
    choose_decode_kernel,
    packed_attention,
    supports_packed,
)
from models.runner.fused_decoder import FusedDecoder, is_fused
from models.sampling.params import SamplingParams
from models.scheduler.output import BlockCopy, PrefillChunk, SlotMove
from models.scheduler.sequence import Sequence

log = logging.getLogger("surge.engine")


# Padded rows over real ones past which a step's chunks attend one by one (see _packed).
PADDED_CHUNKS_MAX_WASTE = 1.5


class ModelRunner:
    def __init__(
        self, model: PreTrainedModel, max_num_seqs: int, max_model_len: int, packed: bool | None = None
    ) -> None:
        """`packed`: None picks the packed step wherever the model supports it (benchmarks force either)."""
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        config = model.config.get_text_config()
        # On the CPU the slots are reserved, not allocated: memory follows the tokens written and
        # never grows by copying the whole cache (models/kv/cache.py).
        self.cache = SlotCache(config.num_hidden_layers, max_num_seqs, max_model_len, reserve=reserves(self.device))
        self.max_model_len = max_model_len
        self._mask_min = torch.finfo(self.dtype).min
        self._sliding_window, self._mixed_layers = _sliding_layout(config)
        self.packed = packed if packed is not None else supports_packed(model)
        self.pool: KVPool | None = None
        if self.device.type == "cuda":
            # cuDNN's attention builds an execution plan for every new input shape, and a decode
            # step's keys are one longer each step: on an H200 each step paid a new plan, several
            # times the step itself. Flash and memory-efficient kernels take any length.
            # Process-wide: this process runs one model.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.decoder: FusedDecoder | None = None
        if self.packed:
            AttentionInterface.register(PACKED_ATTENTION, packed_attention)
            model.set_attn_implementation(PACKED_ATTENTION)
            if self.device.type == "cpu" and self.dtype in HALF_DTYPES:
                heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
                dim = getattr(config, "head_dim", None) or config.hidden_size // heads
                choose_decode_kernel(self.dtype, heads, kv_heads or heads, dim, min(max_num_seqs, 32))
            if is_fused(model):
                self.decoder = self._checked_decoder(FusedDecoder(model, packed_attention))

    def _checked_decoder(self, decoder: FusedDecoder) -> FusedDecoder | None:
        """`decoder` if a probe step's logits through it match transformers' forward; else None
        (and a warning): a model whose layers do something the fused loop does not would
        otherwise serve wrong tokens quietly."""
        vocab = self.model.config.get_text_config().vocab_size
        # Past a small sliding window, so a windowed layer's mask is part of what is compared.
        length = min(self._sliding_window + 2, 64) if self._sliding_window else 6
        probe = Sequence("probe", [i % vocab for i in range(1, length + 1)], SamplingParams(max_tokens=1))
        probe.slot = 0
        chunk = [PrefillChunk(probe, 0, probe.num_prompt_tokens)]
        with torch.inference_mode():
            expected = self._packed(1, chunk, [])
            self.decoder = decoder
            try:
                got = self._packed(1, chunk, [])
            finally:
                self.decoder = None
        # float32 matches to the bit (docs/engine.md); half types may differ by a kernel's rounding.
        tolerance = 1e-4 if self.dtype == torch.float32 else 2e-2
        error = float((got - expected).abs().max())
        if error <= tolerance * max(1.0, float(expected.abs().max())):
            log.info("decoder: fused projections, transformers' module stack bypassed")
            return decoder
        log.warning("decoder: transformers' forward (the fused one differs by %.3g on a probe step)", error)
        return None

    @torch.inference_mode()
    def apply_moves(self, moves: Seq[SlotMove | BlockCopy]) -> None:
        for move in moves:
            if isinstance(move, SlotMove):
                self.cache.move(move.src, move.dst, move.num_tokens)
            elif self.pool is not None:
                self.pool.save(move.slot, move.first_block, move.rows)

    @torch.inference_mode()
    def apply_loads(self, loads: Seq[BlockCopy]) -> None:
        if self.pool is not None:
            for load in loads:
                self.pool.load(load.slot, load.rows)

    def release_slots(self, first_slot: int, end_slot: int) -> None:
        """Slots [first_slot, end_slot) hold no sequence and no pending move's source: their K/V
        memory may go back to the system (on the CPU; elsewhere the cache keeps its memory)."""
        self.cache.release(first_slot, end_slot)

    def release_tail(self, slot: int, first_position: int) -> None:
        """A sequence moved into the slot holds positions [0, first_position) only: the rest,
        left by the longer one before it, may go back (on the CPU)."""
        self.cache.release_tail(slot, first_position)

    def kv_block_bytes(self, block_size: int) -> int:
        return KVPool.block_bytes(self.cache, block_size)

    def kv_pool(self, block_size: int, num_rows: int) -> None:
        self.pool = KVPool(self.cache, block_size, num_rows)

    @torch.inference_mode()
    def forward(self, num_slots: int, chunks: Seq[PrefillChunk], decodes: Seq[Sequence]) -> torch.Tensor:
        if self.packed:
            return self._packed(num_slots, chunks, decodes)
        logits = []
        if chunks:
            chunk_logits = self.prefill(chunks)
            done = [i for i, chunk in enumerate(chunks) if chunk.completes_prompt]
            if done:
                logits.append(chunk_logits[done] if len(done) < len(chunks) else chunk_logits)
        if decodes:
            logits.append(self.decode(num_slots, decodes))
        if not logits:
            return torch.empty(0, 0)
        return logits[0] if len(logits) == 1 else torch.cat(logits)

    def _packed(self, num_slots: int, chunks: Seq[PrefillChunk], decodes: Seq[Sequence]) -> torch.Tensor:
        decode_len = max((seq.num_computed_tokens + 1 for seq in decodes), default=0)
        chunk_len = max((chunk.start + chunk.num_tokens for chunk in chunks), default=0)
        read_len = max(decode_len, chunk_len)
        # Grow first: the scratch column moves with the capacity, and padding must write there.
        self.cache.ensure_capacity(read_len)
        scratch = self.cache.scratch_pos
        num_rows = num_slots if decodes else 0
        input_ids = [0] * num_rows
        positions = [0] * num_rows
        slots = list(range(num_rows))
        write_pos = [scratch] * num_rows
        is_pad = [True] * num_rows
        for seq in decodes:
            slot, position = seq.slot, seq.num_computed_tokens
            input_ids[slot] = seq.last_token_id
            positions[slot] = write_pos[slot] = position
            is_pad[slot] = False
        groups = []
        keep = []  # the rows whose logits come back: completing chunks' last tokens, then decodes
        for chunk in chunks:
            start, end, slot = chunk.start, chunk.start + chunk.num_tokens, chunk.seq.slot
            fits = self._sliding_window is None or chunk.num_tokens <= self._sliding_window
            groups.append(ChunkRows(len(input_ids), chunk.num_tokens, slot, fresh=start == 0 and fits))
            input_ids += chunk.seq.prefill_token_ids[start:end]
            span = range(start, end)
            positions += span
            write_pos += span
            slots += [slot] * chunk.num_tokens
            is_pad += [False] * chunk.num_tokens
            if chunk.completes_prompt:
                keep.append(len(input_ids) - 1)
        keep += [seq.slot for seq in decodes]
        device = self.device
        pos = torch.tensor(positions, device=device)[None]  # (1, N)
        window = self._sliding_window
        fresh = bool(chunks) and all(chunk.start == 0 for chunk in chunks)
        plan = StepPlan(
            write_pos=torch.tensor(write_pos, device=device),
            read_len=read_len,
            slots=torch.tensor(slots, device=device),
            num_rows=num_rows,
            chunks=tuple(groups),
            decode_len=decode_len,
            chunk_len=chunk_len,
            causal_chunks=fresh and (window is None or chunk_len <= window),
        )
        width = max((g.num_tokens for g in groups), default=0)
        # Several chunks attend as one padded batch, unless padding would be most of it: a step
        # that finishes one long prompt (a few tokens) and starts the next (thousands) would pad
        # the few to thousands of rows; they run one by one then, each fresh one causally.
        if len(groups) > 1 and len(groups) * width <= PADDED_CHUNKS_MAX_WASTE * sum(g.num_tokens for g in groups):
            index = [[g.start + min(t, g.num_tokens - 1) for t in range(width)] for g in groups]
            real_rows = [c * width + t for c, g in enumerate(groups) for t in range(g.num_tokens)]
            plan.chunk_index = torch.tensor(index, device=device)
            plan.chunk_slots = torch.tensor([g.slot for g in groups], device=device)
            plan.chunk_real = torch.tensor(real_rows, device=device)
        pad = torch.tensor(is_pad, device=device)[None]
        # Causal chunks need no mask rows: the decode block's alone (a big step's full mask is megabytes).
        rows = slice(num_rows) if plan.causal_chunks else slice(None)
        mask = self._mask(pos[:, rows], pad[:, rows], read_len)
        ids = torch.tensor(input_ids, device=device)[None]
        keep_rows = torch.tensor(keep, dtype=torch.long, device=device)
        self.cache.plan = ACTIVE.plan = plan
        try:
            if self.decoder is not None:
                logits = self.decoder(ids, pos, mask, self.cache, keep_rows)
            else:
                out = self.model(
                    input_ids=ids,
                    position_ids=pos,
                    attention_mask=mask,
                    cache=self.cache,
                    use_cache=True,
                    logits_to_keep=keep_rows,
                )
                logits = out.logits[0]
        finally:
            self.cache.plan = ACTIVE.plan = None
        return logits.float()  # (K, V); K = 0 when every chunk ends mid-prompt

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
            input_ids.append([0] * pad + chunk.seq.prefill_token_ids[chunk.start : end])
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
