"""models/loading/widening.py: a float32 model from a bfloat16 checkpoint is read in bfloat16 and
widened layer by layer as the loader packs or quantizes it: the same model as a float32 load
(every weight, the logits), and the float32 load where the narrow one cannot be exact."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
)

from models.config import ModelConfig
from models.loading import tiny, widening
from models.loading.loader import LoadedModel, load_model
from models.loading.mapped_embedding import MappedEmbedding
from tests.models.loading.test_mapped_embedding import build, logits

CPU = torch.device("cpu")


def load(model_dir: Path, quantization: str, monkeypatch: pytest.MonkeyPatch, narrow: bool) -> LoadedModel:
    monkeypatch.setenv("SURGE_NARROW_LOAD", "1" if narrow else "0")
    # Packed whatever oneDNN measures on this CPU at this toy size: the loads compared take one path.
    monkeypatch.setattr("models.linear.packed.MIN_SPEEDUP", 0.0)
    return load_model(ModelConfig(model=str(model_dir), dtype="float32", quantization=quantization))


def float_dtypes(model: nn.Module) -> set[torch.dtype]:
    tensors = [*model.parameters(), *model.buffers()]
    return {t.dtype for t in tensors if t.is_floating_point()}


@pytest.mark.parametrize(
    ("quantization", "tied", "sharded"),
    [("none", True, False), ("none", False, False), ("int8", True, False), ("none", True, True)],
)
def test_the_narrow_load_is_the_float32_load(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    quantization: str,
    tied: bool,
    sharded: bool,
) -> None:
    model_dir = build(tmp_path / "model", tied=tied, sharded=sharded)
    assert sharded == (model_dir / "model.safetensors.index.json").is_file()
    plain = load(model_dir, quantization, monkeypatch, narrow=False)
    with caplog.at_level(logging.INFO, logger="surge.loader"):
        narrow = load(model_dir, quantization, monkeypatch, narrow=True)
    assert "weights read as bfloat16, each widened to float32" in caplog.text
    assert plain.model is not None and narrow.model is not None
    # Everything left a parameter or buffer is float32, as after a float32 load, and the model says so.
    assert float_dtypes(narrow.model) == float_dtypes(plain.model) == {torch.float32}
    assert narrow.model.config.dtype == torch.float32
    assert narrow.kv_bytes_per_token == plain.kv_bytes_per_token
    embedding = narrow.model.get_input_embeddings()
    assert isinstance(embedding, MappedEmbedding) and embedding.out_dtype == torch.float32
    # Widening is exact: the same weights, so the same logits (packing or not is the probe's call,
    # made afresh in each load, which can only move the last bits).
    torch.testing.assert_close(logits(narrow.model), logits(plain.model), rtol=1e-5, atol=1e-5)


def resident_kib(path: Path) -> int:
    """This process's resident pages of `path`'s mappings (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
            inside = fields[-1] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def test_the_checkpoints_pages_are_let_go_once_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read narrow, every weight first lies in transformers' mapping of the whole file; once each
    is packed, quantized or widened, that mapping must go with them, not stay resident beside the
    model (the embedding keeps a mapping of its own, its pages dropped until rows are looked up)."""
    model_dir = build(tmp_path / "model", tied=True)
    checkpoint = (model_dir / "model.safetensors").resolve()
    loaded = load(model_dir, "int8", monkeypatch, narrow=True)
    assert loaded.model is not None
    assert resident_kib(checkpoint) < checkpoint.stat().st_size // 1024 // 4
    # Sharded: every shard's mapping goes.
    shards = build(tmp_path / "sharded", tied=True, sharded=True)
    assert load(shards, "none", monkeypatch, narrow=True).model is not None
    files = [path.resolve() for path in shards.glob("*.safetensors")]
    assert len(files) > 1
    assert sum(map(resident_kib, files)) < sum(path.stat().st_size for path in files) // 1024 // 4


def test_the_checkpoints_dtype(tmp_path: Path) -> None:
    sharded = build(tmp_path / "sharded", tied=True, sharded=True)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert widening.checkpoint_dtype(sharded) == torch.bfloat16
    assert widening.load_dtype(str(sharded), torch.float32, CPU) == torch.bfloat16
    # Only where it widens exactly, on the CPU.
    assert widening.load_dtype(str(sharded), torch.float16, CPU) == torch.float16
    assert widening.load_dtype(str(sharded), torch.float32, torch.device("cuda")) == torch.float32
    # A checkpoint that keeps one tensor wider than the rest is read as asked.
    mixed = build(tmp_path / "mixed", tied=False)
    weights = load_file(mixed / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"].float()
    save_file(weights, mixed / "model.safetensors", metadata={"format": "pt"})
    assert widening.checkpoint_dtype(mixed) is None
    assert widening.load_dtype(str(mixed), torch.float32, CPU) == torch.float32
    (mixed / "model.safetensors").write_bytes(b"\xff" * 16)  # unreadable: the plain load says why
    assert widening.load_dtype(str(mixed), torch.float32, CPU) == torch.float32


def test_a_quantized_checkpoint_is_read_as_asked(tmp_path: Path) -> None:
    model_dir = build(tmp_path / "model", tied=True)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq"}}))
    assert widening.load_dtype(str(model_dir), torch.float32, CPU) == torch.float32


def test_it_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = build(tmp_path / "model", tied=True)
    monkeypatch.setenv("SURGE_NARROW_LOAD", "0")
    assert widening.load_dtype(str(model_dir), torch.float32, CPU) == torch.float32


def test_a_buffer_built_in_the_narrow_dtype_is_named() -> None:
    """Such a buffer was computed in bfloat16 when the model was built, not read from the file:
    widened, it would not be what a float32 build computes, so the loader reads the model again."""
    model = nn.Module()
    model.register_buffer("inv_freq", torch.ones(4, dtype=torch.float32))
    model.register_buffer("positions", torch.arange(4))
    assert widening.narrow_buffers(model, torch.float32) == []
    model.register_buffer("scale", torch.ones(2, dtype=torch.bfloat16))
    assert widening.narrow_buffers(model, torch.float32) == ["scale"]


def test_widen_turns_the_rest_and_the_config(tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(build(tmp_path / "model", tied=False), dtype=torch.bfloat16)
    widening.widen(model, torch.float32)
    assert float_dtypes(model) == {torch.float32}
    assert model.config.dtype == torch.float32


def test_a_narrow_load_with_such_a_buffer_is_read_again_in_float32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = build(tmp_path / "model", tied=True)
    # Qwen2 builds its rotary frequencies in float32 whatever the dtype; a model that did not is
    # played by the detector naming one.
    monkeypatch.setattr("models.loading.loader.narrow_buffers", lambda model, dtype: ["rotary.scale"])
    with caplog.at_level(logging.INFO, logger="surge.loader"):
        loaded = load(model_dir, "none", monkeypatch, narrow=True)
    assert "weights read as float32, not bfloat16: buffers built in bfloat16 (rotary.scale)" in caplog.text
    assert "each widened" not in caplog.text
    assert loaded.model is not None and float_dtypes(loaded.model) == {torch.float32}


def other_architecture(name: str) -> PretrainedConfig:
    common: dict[str, Any] = {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    }
    if name == "llama3-rope":  # frequencies rescaled at build time
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        return LlamaConfig(**common, rope_scaling={**scaling, "original_max_position_embeddings": 128})
    if name == "gemma3":  # its embedding's scale is a buffer built in the load's dtype
        return Gemma3TextConfig(**common, head_dim=16)
    return GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=256)  # Conv1D, not nn.Linear


@pytest.mark.parametrize(("name", "narrow"), [("llama3-rope", True), ("gpt2", True), ("gemma3", False)])
def test_other_architectures_load_the_same_narrow_or_fall_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str, narrow: bool
) -> None:
    model_dir = tmp_path / name
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(other_architecture(name)).to(torch.bfloat16).save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(tiny.ensure_tokenizer()).save_pretrained(model_dir)
    plain = load(model_dir, "int8", monkeypatch, narrow=False)
    with caplog.at_level(logging.INFO, logger="surge.loader"):
        read = load(model_dir, "int8", monkeypatch, narrow=True)
    assert ("each widened to float32" in caplog.text) == narrow
    assert ("buffers built in bfloat16" in caplog.text) == (not narrow)
    assert plain.model is not None and read.model is not None
    assert float_dtypes(read.model) == {torch.float32}
    assert torch.equal(logits(read.model), logits(plain.model))
