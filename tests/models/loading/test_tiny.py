"""Tests for models/loading/tiny.py: the offline-built tiny model directory and its cache."""

from __future__ import annotations

import hashlib
import random
import threading
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from models.loading import tiny, tiny_corpus

# Generous bands around the targets (~2.6M, ~8M, ~100M), tight enough to catch a wrong size.
PARAM_RANGES = {"s": (2_000_000, 3_500_000), "m": (6_000_000, 10_000_000), "l": (80_000_000, 120_000_000)}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _num_params(model_dir: Path) -> int:
    # Read shapes from the safetensors header: checks what was written without loading 400 MB.
    total = 0
    with safe_open(model_dir / "model.safetensors", framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
            num = 1
            for dim in f.get_slice(name).get_shape():
                num *= dim
            total += num
    return total


@pytest.fixture(scope="module")
def tiny_s(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.build_tiny("s", tmp_path_factory.mktemp("tiny") / "s")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE at import, so patch the constant as well as the env.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_s_has_params_in_range_and_standard_files(tiny_s: Path) -> None:
    low, high = PARAM_RANGES["s"]
    assert low <= _num_params(tiny_s) <= high
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_s / name).is_file(), name


@pytest.mark.parametrize("size", ["m", "l"])
def test_larger_sizes_build_with_params_in_range(size: str, tmp_path: Path) -> None:
    model_dir = tiny.build_tiny(size, tmp_path / size)
    low, high = PARAM_RANGES[size]
    assert low <= _num_params(model_dir) <= high


def test_same_size_gives_identical_files_and_leaves_global_rng_alone(tiny_s: Path, tmp_path: Path) -> None:
    state_before = torch.random.get_rng_state()
    again = tiny.build_tiny("s", tmp_path / "again")
    assert torch.equal(torch.random.get_rng_state(), state_before)
    assert _sha256(again / "model.safetensors") == _sha256(tiny_s / "model.safetensors")
    assert _sha256(again / "tokenizer.json") == _sha256(tiny_s / "tokenizer.json")


def test_loads_offline_through_auto_classes(tiny_s: Path, offline: None) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_s)
    tokenizer = AutoTokenizer.from_pretrained(tiny_s)
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer) == tiny.VOCAB_SIZE
    assert model.config.max_position_embeddings == tiny.MAX_POSITION_EMBEDDINGS


def test_special_token_ids(tiny_s: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_s)
    endoftext, im_start, im_end = tokenizer.convert_tokens_to_ids(list(tiny.SPECIAL_TOKENS))
    assert (endoftext, im_start, im_end) == (tiny.ENDOFTEXT_ID, tiny.IM_START_ID, tiny.IM_END_ID) == (0, 1, 2)
    assert tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token_id == endoftext
    # Special tokens are atomic in text and dropped by skip_special_tokens.
    assert tokenizer.encode("<|im_start|>user")[0] == im_start
    assert tokenizer.decode([im_start, *tokenizer.encode("hi"), im_end, endoftext], skip_special_tokens=True) == "hi"
    generation = GenerationConfig.from_pretrained(tiny_s)
    assert generation.eos_token_id == [im_end, endoftext]
    assert generation.pad_token_id == endoftext


def test_tag_tokens_are_atomic_and_stay_in_the_text(tiny_s: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_s)
    ids = [tiny.TOOL_CALL_ID, tiny.TOOL_CALL_END_ID, tiny.THINK_ID, tiny.THINK_END_ID]
    assert tokenizer.convert_tokens_to_ids(list(tiny.TAG_TOKENS)) == ids == list(range(8188, 8192))
    text = 'ok <tool_call>\n{"a": 1}\n</tool_call><think>x</think>'
    encoded = tokenizer.encode(text)
    assert all(tag_id in encoded for tag_id in ids)
    # Not special: a parser downstream must see them, whatever skip_special_tokens says.
    assert tokenizer.decode(encoded, skip_special_tokens=True) == text


def test_chat_template_renders_tools_calls_and_results(tiny_s: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_s)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert text.count("<|im_start|>system") == 1  # the system message is not repeated
    calls = (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
    )
    assert calls in text
    results = (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrain\n</tool_response><|im_end|>\n"
    )
    assert text.endswith(results + "<|im_start|>assistant\n")
    no_thinking = tokenizer.apply_chat_template(
        messages[1:2], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert no_thinking.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_chat_template_renders_chatml(tiny_s: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_s)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi\nthere<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert without_prompt == text.removesuffix("<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids(tiny.IM_START)


def test_unicode_round_trips_exactly(tiny_s: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_s)
    rng = random.Random(0)
    astral = "".join(chr(rng.randint(0x10000, 0x10FFFF)) for _ in range(20))
    texts = [
        tiny_corpus.SAMPLE_TEXT,
        "  leading, trailing and  double  spaces  \n\n\t",
        "Ünïcödé café 你好世界 こんにちは 👨‍👩‍👧‍👦 🇫🇷 e\u0301 \u200b",
        "".join(chr(i) for i in range(256)),
        astral,
        "don't , . ? ! 'quoted' word .",
    ]
    for text in texts:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_tokenizer_compresses_english(tiny_s: Path) -> None:
    # A trained BPE, not a byte fallback: common words are single tokens.
    tokenizer = AutoTokenizer.from_pretrained(tiny_s)
    text = "The quick brown fox jumps over the lazy dog."
    assert len(tokenizer.encode(text)) <= 12


@pytest.mark.parametrize(
    ("arch", "sliding_window", "model_class"),
    [
        ("llama", None, "LlamaForCausalLM"),
        ("qwen2", None, "Qwen2ForCausalLM"),
        ("mistral", 16, "MistralForCausalLM"),
        ("gpt2", None, "GPT2LMHeadModel"),
    ],
)
def test_each_arch_builds_and_generates(
    arch: str, sliding_window: int | None, model_class: str, tiny_s: Path, tmp_path: Path
) -> None:
    model_dir = tiny_s if arch == "llama" else tiny.build_tiny("s", tmp_path, arch, sliding_window=sliding_window)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert type(model).__name__ == model_class
    assert getattr(model.config, "sliding_window", None) == sliding_window
    # Two rows of different lengths (left-padded), the longer one past the 16-token window.
    prompts = ["Hello", "The quick brown fox jumps over the lazy dog, then naps in the warm sun for an hour."]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    assert batch.input_ids.shape[1] > 16
    output = model.generate(**batch, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert output.shape == (2, batch.input_ids.shape[1] + 4)


def _last_logits_with_first_token_changed(config: object) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(3, tiny.VOCAB_SIZE, (1, 24))
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % tiny.VOCAB_SIZE
    with torch.no_grad():
        return model(ids).logits[0, -1], model(changed).logits[0, -1]


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_sliding_window_is_in_effect(arch: str) -> None:
    # With a 4-token window and 2 layers the last position sees at most the last 7 tokens,
    # so changing the first of 24 must not move its logits; with full attention it must.
    windowed = tiny.build_config("s", arch, sliding_window=4)
    assert not torch.allclose(*_last_logits_with_first_token_changed(tiny.build_config("s", arch)))
    assert torch.allclose(*_last_logits_with_first_token_changed(windowed))
    if arch == "qwen2":
        assert windowed.layer_types == ["sliding_attention"] * 2


def test_default_configs_have_no_sliding_window() -> None:
    # MistralConfig and Qwen2Config default to a 4096 window; the tiny model must not inherit it.
    assert tiny.build_config("s", "mistral").sliding_window is None
    assert tiny.build_config("s", "qwen2").sliding_window is None


def test_rejects_unknown_size_arch_and_misplaced_window(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="size"):
        tiny.build_config("xl")
    with pytest.raises(ValueError, match="arch"):
        tiny.build_config("s", "bert")
    with pytest.raises(ValueError, match="sliding_window"):
        tiny.build_config("s", "llama", sliding_window=16)
    with pytest.raises(ValueError, match="size"):
        tiny.ensure_tiny(tmp_path, size="xl")


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SURGE_CACHE_DIR", str(tmp_path))
    assert tiny.default_cache_dir() == tmp_path
    monkeypatch.delenv("SURGE_CACHE_DIR")
    assert tiny.default_cache_dir() == Path.home() / ".cache" / "surge"


def test_ensure_tiny_concurrent_builds_agree_then_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    barrier = threading.Barrier(2)
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        barrier.wait()
        try:
            results.append(tiny.ensure_tiny(tmp_path, size="s"))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert results[0] == results[1]
    model_dir = results[0]
    assert f"v{tiny.BUILD_VERSION}" in model_dir.name
    # Exactly the finished build is left: no staging directories.
    assert [p.name for p in tmp_path.iterdir()] == [model_dir.name]
    assert _num_params(model_dir) > 0

    def fail_build(*args: object, **kwargs: object) -> Path:
        raise AssertionError("a cached build must not be rebuilt")

    monkeypatch.setattr(tiny, "build_tiny", fail_build)
    assert tiny.ensure_tiny(tmp_path, size="s") == model_dir


def test_ensure_tiny_loser_of_race_uses_winners_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Simulate another process finishing first: the target appears while we are still building.
    target = tmp_path / f"tiny-s-v{tiny.BUILD_VERSION}"

    def racing_build(size: str, out_dir: Path, arch: str = "llama") -> Path:
        (out_dir / "ours").write_text("loser")
        target.mkdir()
        (target / "theirs").write_text("winner")
        return out_dir

    monkeypatch.setattr(tiny, "build_tiny", racing_build)
    assert tiny.ensure_tiny(tmp_path, size="s") == target
    assert (target / "theirs").is_file()
    assert not (target / "ours").exists()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_ensure_tiny_cleans_up_after_a_failed_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken_build(size: str, out_dir: Path, arch: str = "llama") -> Path:
        (out_dir / "partial").write_text("x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny, "build_tiny", broken_build)
    with pytest.raises(RuntimeError, match="disk full"):
        tiny.ensure_tiny(tmp_path, size="s")
    assert list(tmp_path.iterdir()) == []


def test_greedy_text_never_stalls_on_a_partial_character(tiny_s: Path) -> None:
    """Regression: random weights picked tokens holding part of a UTF-8 character as often as any
    other, a run of them rarely formed a character, and every server withheld the stream's text
    for dozens of tokens (benchmarks read that as seconds of time to first token). Those tokens'
    output rows are zero now, so greedy decoding never picks one."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_s)
    model = AutoModelForCausalLM.from_pretrained(tiny_s)
    partial = [i for i in range(tiny.VOCAB_SIZE) if "\ufffd" in tokenizer.decode([i])]
    assert len(partial) > 100  # the tokenizer has plenty (CJK, accented Latin split into bytes)
    assert not model.get_output_embeddings().weight[partial].any()
    rng = random.Random(0)
    words = ["time", "year", "people", "way", "day", "world", "école", "数据", "naïve"]
    prompts = [" ".join(rng.choices(words, k=8)) for _ in range(8)]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=48, do_sample=False, eos_token_id=None, min_new_tokens=48)
    generated = out[:, batch["input_ids"].shape[1] :]
    assert not set(generated.flatten().tolist()) & set(partial)


def test_cached_tokenizer_is_the_trained_one_and_is_built_once(tmp_path: Path) -> None:
    """The echo model's tokenizer comes from disk (tiny.ensure_tokenizer): it must encode, decode
    and render chats exactly as a freshly trained one, and a second call must reuse the build."""
    built = tiny.build_tokenizer()
    path = tiny.ensure_tokenizer(tmp_path)
    cached = AutoTokenizer.from_pretrained(path)
    text = "Hello, world! Ünïcödé 日本語 def f(x: int) -> None:\n\treturn"
    assert cached.encode(text) == built.encode(text)
    assert cached.decode(built.encode(text)) == text
    chat = [{"role": "user", "content": "hi"}]
    assert cached.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == built.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )
    assert cached.eos_token_id == tiny.IM_END_ID and len(cached) == tiny.VOCAB_SIZE
    stamp = (path / "tokenizer.json").stat().st_mtime_ns
    assert tiny.ensure_tokenizer(tmp_path) == path
    assert (path / "tokenizer.json").stat().st_mtime_ns == stamp


def test_muting_a_wider_vocabulary_zeroes_the_ids_the_tokenizer_cannot_decode() -> None:
    """A real-size shape over this tokenizer (Qwen's 151,936 rows against 8,192 ids, as the
    benchmarks build) would pick ids the tokenizer does not know, which decode to nothing; they are
    muted with the partial characters, and the rows the tokenizer decodes whole are kept."""
    config = tiny.build_config("s")
    config.vocab_size = tiny.VOCAB_SIZE + 512
    config.tie_word_embeddings = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(tiny.ensure_tokenizer())
    tiny.mute_partial_characters(model, tokenizer)
    rows = model.get_output_embeddings().weight
    assert len(tokenizer) == tiny.VOCAB_SIZE
    assert not rows[tiny.VOCAB_SIZE :].any()
    whole = [i for i in range(tiny.VOCAB_SIZE) if "\ufffd" not in tokenizer.decode([i])]
    assert len(whole) > tiny.VOCAB_SIZE // 2 and bool(rows[whole].abs().sum(dim=1).gt(0).all())
