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
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
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

# Bump whenever the recipe (corpus, tokenizer, dims, seed) changes, so cached builds are redone.
BUILD_VERSION = 2

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Given to the trainer first and in this order, so their ids are fixed: 0, 1, 2.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2

VOCAB_SIZE = 8192
MAX_POSITION_EMBEDDINGS = 2048
WEIGHT_SEED = 0
CORPUS_SEED = 1234
# About 1.3 MB of pseudo-text: enough distinct words to fill 8192 merges, small enough to train in ~1 s.
CORPUS_LINES = 16_000

ARCHS = ("llama", "qwen2", "mistral", "gpt2")
# m builds in a few seconds and is the size the serving benchmarks use (docs/performance.md).
DEFAULT_SIZE = "m"

# ChatML. Content may be a string, None (an assistant turn that only called tools) or a list of
# OpenAI content parts, whose text parts are joined with "\n" (as vLLM does).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{{- message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text')"
    " | join('\\n') -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
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

# The seed text the corpus is grown from: prose, code, JSON and non-ASCII scripts, so that
# common English words, indentation and multi-byte characters all get merges of their own.
SAMPLE_TEXT = """\
The quick brown fox jumps over the lazy dog. A server streams tokens to many clients at once.
Continuous batching lets new requests join while others are still decoding their answers.
Please summarise the following paragraph in one sentence, and keep the tone friendly.
Once upon a time, in a small village by the sea, there lived an old fisherman and his cat.
What is the capital of France? The capital of France is Paris. How many legs does a spider have?
I think the answer is 42, but let me check the documentation before I commit to it.
Thank you! You're welcome. Could you explain that again, step by step, with an example?
def add(a: int, b: int) -> int:
    return a + b

class Scheduler:
    def __init__(self, max_num_seqs: int = 32) -> None:
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []

    def schedule(self) -> list[Sequence]:
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.pop(0))
        return self.running

for i in range(10):
    if i % 2 == 0:
        print(f"even: {i}")
    else:
        print("odd", i, sep=", ")
{"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}
{"id": "chatcmpl-123", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}}]}
SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;
<html><body><p class="note">Hello, world &amp; friends</p></body></html>
$ curl -s http://localhost:8000/v1/models | jq '.data[0].id'
Le café est très bon à Paris ; l'été dernier, nous sommes allés à la plage près de Nice.
Ça va ? Où est la gare ? Je préfère le thé au café, mais j'adore les crêpes.
Der Bär läuft über die Straße. Schöne Grüße aus München! Die Größe ist übermäßig.
El niño comió una piña en la montaña. ¿Dónde está la biblioteca? ¡Qué día tan bonito!
Português: não, ação, coração. Polski: zażółć gęślą jaźń. Čeština: příliš žluťoučký kůň.
Привет, мир! Как дела? Съешь же ещё этих мягких французских булок, да выпей чаю.
Γειά σου κόσμε. Ἡ γλῶσσα μου ἔδωσαν ἑλληνική. Καλημέρα!
你好，世界！今天天气很好，我们去公园散步吧。机器学习模型正在生成文本。
日本語のテキストです。東京は大きな都市です。ありがとうございます！カタカナもあります。
안녕하세요, 세계! 한국어 문장입니다. 감사합니다.
مرحبا بالعالم. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก
Emoji: 😀 😂 🎉 🚀 ❤️ 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✅ ⚡ 🔥 🤖 — and symbols: € £ ¥ © ® ™ ° ± × ÷ → ← ∞ ≈ ≠ ≤ ≥
Math: ∑_{i=1}^{n} x_i² = ∫₀¹ f(x) dx; α + β = γ; π ≈ 3.14159; √2 ≈ 1.41421.
"""

# Syllable parts for pseudo-words; the empty strings weight "no onset/coda" more heavily.
_ONSETS: tuple[str, ...] = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s")
_ONSETS += ("t", "v", "w", "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sk", "sl", "st", "str")
_ONSETS += ("th", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou", "y", "é", "è", "ä", "ö", "ü", "á")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "ng", "nd", "st", "ck", "rt", "ss", "x", "sh", "ch")
_EMOJI = ("😀", "😂", "🎉", "🚀", "❤️", "👍", "🤖", "🔥", "✅", "⚡", "🌍", "🍕", "🐍", "🦀", "✨")
_PUNCT = (".", ".", ".", ",", "!", "?", ";", ":", " —", "...")


def _pseudo_word(rng: random.Random) -> str:
    syllables = rng.choice((1, 1, 2, 2, 2, 3, 3, 4))
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
    return word.capitalize() if rng.random() < 0.15 else word


def _cjk_run(rng: random.Random, pool: list[str]) -> str:
    # Mostly characters seen in the sample (so they get merges), some fresh ones from the
    # CJK Unified Ideographs block (so rare characters still occur).
    chars = [rng.choice(pool) if rng.random() < 0.8 else chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(12)]
    return "".join(chars[: rng.randint(3, 12)])


def _identifier(rng: random.Random) -> str:
    parts = [_pseudo_word(rng).lower() for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.5:
        return "_".join(parts)
    return parts[0] + "".join(p.capitalize() for p in parts[1:])


def _code_line(rng: random.Random) -> str:
    name, arg, other = _identifier(rng), _identifier(rng), _identifier(rng)
    number = rng.randint(0, 10_000)
    indent = " " * rng.choice((0, 0, 4, 4, 8, 12))
    return indent + rng.choice(
        (
            f"def {name}({arg}: int, {other}: str = {number}) -> None:",
            f"return {arg} + {other} * {number}",
            f"{name} = [{arg}, {other}, {number}]",
            f"if {arg} is not None and {other} >= {number}:",
            f"for {arg} in range({number}):",
            f'{name}["{arg}"] = {rng.random():.4f}',
            f"self.{name} = {arg}.{other}({number})",
            f'{{"{name}": "{arg}", "{other}": {number}}}',
            f"# {name} {arg} {other}",
            f"const {name} = ({arg}) => {arg}.{other} ?? {number};",
        )
    )


def _corpus_line(rng: random.Random, sample_lines: list[str], sample_words: list[str], cjk: list[str]) -> str:
    kind = rng.random()
    if kind < 0.25:
        return rng.choice(sample_lines)
    if kind < 0.45:
        return " ".join(rng.choice(sample_words) for _ in range(rng.randint(4, 16))) + rng.choice(_PUNCT)
    if kind < 0.75:
        words = [_pseudo_word(rng) for _ in range(rng.randint(4, 14))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), rng.choice(_EMOJI))
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99_999)))
        return " ".join(words) + rng.choice(_PUNCT)
    if kind < 0.9:
        return _code_line(rng)
    return _cjk_run(rng, cjk) + rng.choice(("。", "，", "！", "？", "、")) + _cjk_run(rng, cjk)


def build_corpus(num_lines: int = CORPUS_LINES, seed: int = CORPUS_SEED) -> list[str]:
    """Deterministic pseudo-text for training the tokenizer: same arguments, same lines."""
    rng = random.Random(seed)
    sample_lines = [line for line in SAMPLE_TEXT.splitlines() if line.strip()]
    sample_words = SAMPLE_TEXT.split()
    cjk = sorted({ch for ch in SAMPLE_TEXT if "\u3040" <= ch <= "\u9fff"})
    return [_corpus_line(rng, sample_lines, sample_words, cjk) for _ in range(num_lines)]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train the 8192-token byte-level BPE and wrap it with the ChatML template."""
    tokenizer = Tokenizer(models.BPE())
    # add_prefix_space=False plus the ByteLevel decoder is what makes decode(encode(text)) == text.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 bytes, so any input encodes even if the corpus never showed that byte.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = build_corpus()
    tokenizer.train_from_iterator(lines, trainer=trainer, length=len(lines))
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
            n_positions=MAX_POSITION_EMBEDDINGS,
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
    _mute_partial_characters(model, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=None,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _mute_partial_characters(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    """Zero the output rows of tokens that are only part of a UTF-8 character (658 of 8192).

    NOTE: random weights pick them about as often as any other token, and a sequence of them
    rarely forms a valid character: the text stays an incomplete character for dozens of tokens,
    and a server (surge and `transformers serve` alike) streams no text until it resolves, which
    made time-to-first-text and inter-token figures in benchmarks seconds long for reasons that
    have nothing to do with serving. A zero row scores 0 against logits spread around 0, so
    greedy decoding never picks one; sampling still can, as with a real model.
    """
    partial = [i for i in range(VOCAB_SIZE) if "\ufffd" in tokenizer.decode([i])]
    with torch.no_grad():
        model.get_output_embeddings().weight[partial] = 0.0


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
    training it takes ~2 s on 2 cores, loading it ~30 ms, and the echo server needs it in both
    of its processes."""
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
