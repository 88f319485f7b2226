"""A packed step's forward for Llama-shaped models without transformers' module stack, on fused
projections: one matmul for a layer's queries, keys and values, one for its gate and up halves.

On the tiny `m` (4 layers, 256 wide) at 32 decoding rows, transformers' forward spends about a
third of a step outside the kernels: 29 linear calls, keyword plumbing through five wrappers a
layer, output records. The same step through this loop: 15.8 -> 13.2 ms (2 AVX2 cores, 2 threads,
medians of 60 interleaved steps); on `l` (12 layers, 768 wide), where the matmuls dominate,
153.5 -> 145.3 ms. The logits are the same to the bit on both (per-column results do not depend
on which other columns share the call).

What is reused rather than rewritten: the model's embedding, rotary embedding (every RoPE scaling
transformers knows), norms, activation, `apply_rotary_pos_emb` and output head, and the runner's
packed attention; what is fused is only the order of the calls and the concatenated weights. So
it takes only the architectures whose decoder layer is the pre-norm Llama layer (Llama, Mistral,
Qwen2), checked by class, and the runner checks its logits against transformers' forward on a
probe step before using it (`models/runner/model_runner.py`).

`fuse_projections` runs at load, before the linear layers are packed or quantized (the packed
kernels keep no float weight to concatenate later). It leaves transformers' forward working:
`q_proj`, `k_proj` and `v_proj` (and `gate_proj`, `up_proj`) become slices of the fused layer's
output, computed once per input (`_SharedCall`), so anything that runs the model the usual way
(the split runner, scripts/perplexity.py) pays no more than before, and no weight is held twice.
int8 weights are scaled per output channel and activations per row, so quantizing the fused
layer gives the same codes as quantizing its parts.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from models.kv.cache import SlotCache

# model class -> its decoder layer class: the pre-norm Llama layer (norm, attention, residual,
# norm, gated MLP, residual) with q/k/v/o and gate/up/down projections; Qwen2 adds q/k/v biases
# and per-layer sliding windows (its mask dict), Mistral one window for all.
SUPPORTED = {
    "LlamaForCausalLM": "LlamaDecoderLayer",
    "MistralForCausalLM": "MistralDecoderLayer",
    "Qwen2ForCausalLM": "Qwen2DecoderLayer",
}


class _SharedCall:
    """One call of the fused layer per input, read by each of its slices.

    transformers' attention calls q_proj, k_proj and v_proj on the same tensor one after another
    (the MLP gate_proj and up_proj likewise): the first slice to see a new input runs the fused
    layer, the others slice its output, and the last one lets it go (a long prefill's output is
    megabytes per layer). Per thread: runners on different threads may share one model."""

    def __init__(self, owner: nn.Module, name: str, bounds: list[tuple[int, int]]) -> None:
        self.owner, self.name, self.bounds = owner, name, bounds
        self.local = threading.local()

    def __call__(self, x: torch.Tensor, part: int) -> torch.Tensor:
        state = self.local
        if getattr(state, "input", None) is not x:
            state.input, state.output, state.unread = x, getattr(self.owner, self.name)(x), set(range(len(self.bounds)))
        start, end = self.bounds[part]
        out = state.output[..., start:end]
        state.unread.discard(part)
        if not state.unread:
            state.input = state.output = None
        return out


class FusedSlice(nn.Module):
    """What was `q_proj` (or k, v, gate, up): its columns of the fused layer's output."""

    def __init__(self, shared: _SharedCall, part: int) -> None:
        super().__init__()
        # Not a submodule: the fused layer is registered on the attention (or MLP) module itself.
        self._shared = shared
        self.part = part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._shared(x, self.part)

    def extra_repr(self) -> str:
        start, end = self._shared.bounds[self.part]
        return f"{self._shared.name}[{start}:{end}]"


def _fuse(owner: nn.Module, names: tuple[str, ...], fused_name: str) -> None:
    parts: list[nn.Linear] = [getattr(owner, name) for name in names]
    weight = torch.cat([p.weight.detach() for p in parts])
    biases = [p.bias for p in parts]
    # On the meta device: no random initialisation of a weight about to be replaced.
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=biases[0] is not None, device="meta")
    fused.weight = nn.Parameter(weight.to(parts[0].weight.dtype), requires_grad=False)
    if fused.bias is not None:
        fused.bias = nn.Parameter(torch.cat([b.detach() for b in biases if b is not None]), requires_grad=False)
    bounds, start = [], 0
    for p in parts:
        bounds.append((start, start + p.out_features))
        start += p.out_features
    setattr(owner, fused_name, fused)
    shared = _SharedCall(owner, fused_name, bounds)
    for part, name in enumerate(names):
        setattr(owner, name, FusedSlice(shared, part))


def fusable(model: nn.Module) -> bool:
    """Whether `model` is one of SUPPORTED, every layer of the expected class with plain linear
    projections (not already fused, not quantized by someone else) sharing a bias setting."""
    layer_class = SUPPORTED.get(type(model).__name__)
    layers = _layers(model)
    if layer_class is None or not layers or not hasattr(getattr(model, "model", None), "rotary_emb"):
        return False
    for layer in layers:
        if type(layer).__name__ != layer_class:
            return False
        groups = ((layer.self_attn, ("q_proj", "k_proj", "v_proj")), (layer.mlp, ("gate_proj", "up_proj")))
        for owner, names in groups:
            parts = [getattr(owner, name, None) for name in names]
            if not all(type(p) is nn.Linear for p in parts):
                return False
            if len({p.bias is None for p in parts if p is not None}) != 1:
                return False
    return True


def fuse_projections(model: nn.Module) -> bool:
    """Fuse every layer's q/k/v and gate/up projections in place (see the module docstring);
    False, and the model untouched, where it is not a supported architecture."""
    if not fusable(model):
        return False
    for layer in _layers(model):
        _fuse(layer.self_attn, ("q_proj", "k_proj", "v_proj"), "qkv_proj")
        _fuse(layer.mlp, ("gate_proj", "up_proj"), "gate_up_proj")
    return True


def _layers(model: nn.Module) -> list[Any]:
    """The decoder layers of a `...ForCausalLM` (its `model.layers`); none where it has no such list."""
    return list(getattr(getattr(model, "model", None), "layers", None) or [])


def is_fused(model: nn.Module) -> bool:
    layers = _layers(model)
    return bool(layers) and all(hasattr(layer.self_attn, "qkv_proj") for layer in layers)


AttentionFn = Callable[..., tuple[torch.Tensor, Any]]


class FusedDecoder:
    """The forward of a fused model's packed step: (1, N) tokens in, the kept rows' logits out."""

    def __init__(self, model: nn.Module, attention: AttentionFn) -> None:
        self.model = model
        self.inner: Any = getattr(model, "model")  # noqa: B009 - typed as Any, transformers' submodule
        self.attention = attention
        first = self.inner.layers[0].self_attn
        self.head_dim: int = first.head_dim
        self.num_heads: int = first.config.num_attention_heads
        self.num_kv_heads: int = first.config.num_key_value_heads
        # The model's own rotary helper (the same function transformers' attention calls).
        self.apply_rotary = sys.modules[type(first).__module__].apply_rotary_pos_emb
        # Which mask each layer reads where the runner builds one per kind (Qwen2's mixed layers).
        num_layers = len(self.inner.layers)
        self.layer_types = getattr(model.config, "layer_types", None) or ["full_attention"] * num_layers

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | dict[str, torch.Tensor],
        cache: SlotCache,
        keep: torch.Tensor,
    ) -> torch.Tensor:
        """input_ids, positions: (1, N); mask as transformers' attention would get it (a dict per
        layer type where layers differ); returns the logits of rows `keep`, (K, V)."""
        inner = self.inner
        num_tokens = input_ids.shape[1]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        q_end, k_end = heads * head_dim, (heads + kv_heads) * head_dim
        hidden = inner.embed_tokens(input_ids)  # (1, N, E)
        cos, sin = inner.rotary_emb(hidden, position_ids=positions)
        for index, layer in enumerate(inner.layers):
            attn = layer.self_attn
            qkv = attn.qkv_proj(layer.input_layernorm(hidden))  # (1, N, (H + 2 KVH) D)
            query = qkv[..., :q_end].view(1, num_tokens, heads, head_dim).transpose(1, 2)
            key = qkv[..., q_end:k_end].view(1, num_tokens, kv_heads, head_dim).transpose(1, 2)
            value = qkv[..., k_end:].view(1, num_tokens, kv_heads, head_dim).transpose(1, 2)
            query, key = self.apply_rotary(query, key, cos, sin)
            key, value = cache.slot_layers[index].update(key, value)
            layer_mask = mask[self.layer_types[index]] if isinstance(mask, dict) else mask
            out, _ = self.attention(attn, query, key, value, layer_mask, dropout=0.0, scaling=attn.scaling)
            hidden = hidden + attn.o_proj(out.reshape(1, num_tokens, -1))
            mlp = layer.mlp
            gate_up = mlp.gate_up_proj(layer.post_attention_layernorm(hidden))
            half = gate_up.shape[-1] // 2
            hidden = hidden + mlp.down_proj(mlp.act_fn(gate_up[..., :half]) * gate_up[..., half:])
        hidden = inner.norm(hidden)
        return self.model.lm_head(hidden[0, keep])  # type: ignore[operator]
