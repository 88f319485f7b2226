"""The embedded tiny model: a random-weight causal LM and a locally trained tokenizer.

Owns building a standard Hugging Face model directory (config.json, model.safetensors,
generation_config.json, tokenizer files) entirely offline, so tests and demos need no
downloads, and caching one built directory per size. It knows nothing of the engine or HTTP;
the result loads through `AutoModelForCausalLM` / `AutoTokenizer` like any other checkpoint.

Everything is deterministic: the tokenizer is trained on pseudo-text generated in-process from
a seeded `random.Random`, and the weights come from a fixed torch seed, so the same size (and
architecture) gives byte-identical files on every machine with the same library versions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from models.loading.tiny_corpus import build_corpus

# Bump whenever the recipe (corpus, tokenizer, dims, seed, template) changes, so cached builds are redone.
BUILD_VERSION = 4

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Given to the trainer first and in this order, so their ids are fixed: 0, 1, 2.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
# Tags of tool calls and reasoning, as Qwen2.5 and Qwen3 have them: added tokens that decode to
# their text (not special, so they are never skipped), the last ids of the vocabulary.
TOOL_CALL, TOOL_CALL_END, THINK, THINK_END = "<tool_call>", "</tool_call>", "<think>", "</think>"
TAG_TOKENS = (TOOL_CALL, TOOL_CALL_END, THINK, THINK_END)

VOCAB_SIZE = 8192
TOOL_CALL_ID, TOOL_CALL_END_ID, THINK_ID, THINK_END_ID = range(VOCAB_SIZE - len(TAG_TOKENS), VOCAB_SIZE)
# Long enough for an agent's turn (the Codex CLI's first request is ~18,600 tokens: its
# instructions and tool schemas), so `make run` serves such clients; RoPE positions cost nothing
# to raise, and the CPU's K/V is committed per token written, not per position allowed.
MAX_POSITION_EMBEDDINGS = 32768
# GPT-2 learns a vector per position (32768 of them would outweigh the m model's 8.4M parameters).
GPT2_MAX_POSITIONS = 2048
WEIGHT_SEED = 0

ARCHS = ("llama", "qwen2", "mistral", "gpt2")
# m builds in a few seconds and is the size the serving benchmarks use (docs/performance.md).
DEFAULT_SIZE = "m"

# ChatML with tools, tool calls and tool results the way Qwen2.5 writes them (Hermes style), so
# the whole tool-calling path runs offline. Content may be a string, None (an assistant turn that
# only called tools) or a list of OpenAI content parts, whose text parts are joined with "\n" (as
# vLLM does). A call's arguments may be an object or a JSON string. `enable_thinking=False` (a
# chat_template_kwargs) closes an empty reasoning block in the prompt, as Qwen3's template does.
CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is not none -%}"
    "{{- content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n') -}}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- text(messages[0]['content']) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if tools and loop.first and message['role'] == 'system' -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(message['content']) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + text(message['content']) -}}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for tool_call in message['tool_calls'] -%}"
    "{%- set call = tool_call['function'] if tool_call['function'] is defined else tool_call -%}"
    "{%- if not loop.first or text(message['content']) -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' -}}"
    "{%- if call['arguments'] is string -%}{{- call['arguments'] -}}"
    "{%- else -%}{{- call['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


@dataclass(frozen=True, slots=True)
class TinyDims:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


# head_dim 32 on s/m and 64 on l; s keeps plain multi-head attention and m/l use GQA (kv = heads/2),
# so the two attention layouts are both exercised. Intermediate sizes keep the totals near 2.6M,
# 8.4M and 97.5M parameters.
SIZES: dict[str, TinyDims] = {
    "s": TinyDims(128, 2, 4, 4, 512),
    "m": TinyDims(256, 4, 8, 4, 1024),
    "l": TinyDims(768, 12, 12, 6, 2304),
}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train the 8192-token byte-level BPE and wrap it with the ChatML template."""
    tokenizer = Tokenizer(models.BPE())
    # add_prefix_space=False plus the ByteLevel decoder is what makes decode(encode(text)) == text.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TAG_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 bytes, so any input encodes even if the corpus never showed that byte.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = build_corpus()
    tokenizer.train_from_iterator(lines, trainer=trainer, length=len(lines))
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAG_TOKENS])
    tag_ids = [tokenizer.token_to_id(tag) for tag in TAG_TOKENS]
    if tag_ids != [TOOL_CALL_ID, TOOL_CALL_END_ID, THINK_ID, THINK_END_ID]:
        raise RuntimeError(f"the tag tokens got ids {tag_ids}; the trainer made a smaller vocabulary than asked")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        # Decoder-only batching pads on the left so every row's last token is real.
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_config(
    size: str,
    arch: str = "llama",
    *,
    sliding_window: int | None = None,
    max_window_layers: int = 0,
) -> PretrainedConfig:
    """The model config for one size and architecture, with the tokenizer's special ids.

    `sliding_window` applies to mistral and qwen2 only. For qwen2, layers at index >=
    `max_window_layers` slide (0: all of them), following transformers' Qwen2Config.
    """
    if size not in SIZES:
        raise ValueError(f"unknown tiny size {size!r}; expected one of {sorted(SIZES)}")
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; expected one of {list(ARCHS)}")
    if sliding_window is not None and arch not in ("mistral", "qwen2"):
        raise ValueError(f"sliding_window is only supported for mistral and qwen2, not {arch!r}")
    dims = SIZES[size]
    # Either id ends generation: <|im_end|> closes a chat turn, <|endoftext|> a plain completion.
    # No BOS: the tokenizer adds none, and GPT2Config's default (50256) is outside our vocab.
    special: dict[str, Any] = {
        "bos_token_id": None,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "pad_token_id": ENDOFTEXT_ID,
    }
    if arch == "gpt2":
        return GPT2Config(
            vocab_size=VOCAB_SIZE,
            n_positions=GPT2_MAX_POSITIONS,
            n_embd=dims.hidden_size,
            n_layer=dims.num_hidden_layers,
            n_head=dims.num_attention_heads,
            n_inner=dims.intermediate_size,
            # No dropout: a served model is in eval mode anyway, and this keeps train() calls harmless.
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=False,
            **special,
        )
    common: dict[str, Any] = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": dims.hidden_size,
        "intermediate_size": dims.intermediate_size,
        "num_hidden_layers": dims.num_hidden_layers,
        "num_attention_heads": dims.num_attention_heads,
        "num_key_value_heads": dims.num_key_value_heads,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "tie_word_embeddings": False,
        **special,
    }
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "mistral":
        # NOTE: MistralConfig defaults to a 4096-token window; None means full attention.
        return MistralConfig(sliding_window=sliding_window, **common)
    return Qwen2Config(
        use_sliding_window=sliding_window is not None,
        sliding_window=sliding_window,
        max_window_layers=max_window_layers,
        **common,
    )


def build_tiny(
    size: str,
    out_dir: Path,
    arch: str = "llama",
    *,
    sliding_window: int | None = None,
    max_window_layers: int = 0,
) -> Path:
    """Write a complete model directory for `size`/`arch` into `out_dir` and return it."""
    config = build_config(size, arch, sliding_window=sliding_window, max_window_layers=max_window_layers)
    tokenizer = build_tokenizer()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # fork_rng keeps the caller's global torch RNG untouched while we seed the weight init.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(WEIGHT_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    mute_partial_characters(model, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=None,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def mute_partial_characters(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    """Zero the output rows of tokens that are only part of a UTF-8 character (658 of 8192), and
    of ids past the tokenizer's vocabulary (a real-size shape over this tokenizer has ~144k).

    NOTE: random weights pick them about as often as any other token, and a sequence of them
    rarely forms a valid character (an unknown id decodes to nothing at all): the text stays
    empty or an incomplete character for dozens of tokens, and a server (surge, llama-server
    and `transformers serve` alike) streams no text until it resolves, which made
    time-to-first-text and inter-token figures in benchmarks seconds long for reasons that have
    nothing to do with serving. A zero row scores 0 against logits spread around 0, so greedy
    decoding never picks one; sampling still can, as with a real model. With tied embeddings
    the muted ids' input vectors are zero too; prompts of whole characters never use them.
    """
    rows = model.get_output_embeddings().weight
    known = len(tokenizer)
    partial = [i for i in range(known) if "\ufffd" in tokenizer.decode([i])]
    with torch.no_grad():
        rows[partial] = 0.0
        rows[known:] = 0.0


def default_cache_dir() -> Path:
    """`$SURGE_CACHE_DIR`, else `~/.cache/surge`."""
    configured = os.environ.get("SURGE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "surge"


def ensure_tiny(cache_dir: Path | None = None, size: str = DEFAULT_SIZE) -> Path:
    """Return the cached llama build of `size`, building it first if it is missing."""
    if size not in SIZES:
        raise ValueError(f"unknown tiny size {size!r}; expected one of {sorted(SIZES)}")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return _build_once(root / f"tiny-{size}-v{BUILD_VERSION}", lambda out: build_tiny(size, out))


def ensure_tokenizer(cache_dir: Path | None = None) -> Path:
    """Return the cached directory of the tokenizer alone (the echo model's), building it if missing:
    training it takes seconds, loading it milliseconds, and the echo server needs it in both of
    its processes."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return _build_once(root / f"tokenizer-v{BUILD_VERSION}", lambda out: build_tokenizer().save_pretrained(out))


def _build_once(target: Path, build: Callable[[Path], object]) -> Path:
    """`target`, built by `build(directory)` first if it is missing.

    Safe under concurrent callers: each builds into its own temporary directory beside the
    target and renames it into place; renaming onto an existing (complete) build fails, and
    the loser uses the winner's directory. A directory at the target is therefore always complete.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
