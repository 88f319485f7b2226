"""models/loading/mapped_embedding.py: a float32 model's input embedding read from its bfloat16
checkpoint through a mapping, after the linear layers are packed or quantized (what the loader
does): the same logits, the float32 table let go, and the copy kept where the file's tensor is not
the model's table."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from models.config import ModelConfig
from models.linear.packed import pack_linears
from models.loading import mapped_embedding
from models.loading.loader import load_model
from models.loading.mapped_embedding import MappedEmbedding, map_input_embeddings

PROMPT = torch.tensor([[5, 17, 300, 2, 511, 64, 9]])


def build(out: Path, tied: bool, sharded: bool = False) -> Path:
    """A small Qwen2 with random weights, saved in bfloat16 as published checkpoints are."""
    config = Qwen2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=512,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out, max_shard_size="100KB" if sharded else "5GB")
    return out


def reference_logits(model_dir: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(PROMPT).logits


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(PROMPT).logits  # type: ignore[no-any-return]


@pytest.mark.parametrize(("tied", "sharded"), [(True, False), (False, False), (True, True)])
def test_a_float32_model_reads_its_bfloat16_table_mapped(tmp_path: Path, tied: bool, sharded: bool) -> None:
    model_dir = build(tmp_path / "model", tied, sharded)
    assert sharded == (model_dir / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert pack_linears(model, rows_hint=8, min_speedup=0) > 0
    table = weakref.ref(model.get_input_embeddings().weight)
    freed = map_input_embeddings(model, str(model_dir))
    gc.collect()
    assert freed == 512 * 64 * 4
    assert table() is None  # nothing else held the float32 table
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, MappedEmbedding)
    assert embedding.table.dtype == torch.bfloat16
    assert embedding(torch.tensor([3, 4])).dtype == torch.float32
    # Widening bfloat16 is exact, and the linears are packed as before: the same logits.
    torch.testing.assert_close(logits(model), reference_logits(model_dir), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("quantization", "tied"), [("none", False), ("int8", True)])
def test_the_loader_maps_it_for_float32_and_int8(tmp_path: Path, quantization: str, tied: bool) -> None:
    """Tied under int8 (its output layer is 8-bit); untied in float32, where whether the output
    layer is packed depends on what oneDNN measures on this CPU."""
    model_dir = build(tmp_path / "model", tied=tied)
    expected = reference_logits(model_dir)
    loaded = load_model(ModelConfig(model=str(model_dir), dtype="float32", quantization=quantization))
    assert loaded.model is not None
    assert isinstance(loaded.model.get_input_embeddings(), MappedEmbedding)
    got = logits(loaded.model)
    if quantization == "none":
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    else:  # int8 weights move the logits; their top tokens mostly stay
        assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.7


def test_a_table_that_is_not_the_files_stays_in_memory(tmp_path: Path) -> None:
    model_dir = build(tmp_path / "model", tied=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[7, 3] += 1.0  # one value the file does not have
    assert map_input_embeddings(model, str(model_dir)) == 0
    assert type(model.get_input_embeddings()) is torch.nn.Embedding


def test_a_tied_output_layer_still_reading_the_table_keeps_it(tmp_path: Path) -> None:
    """Not packed (a GPU, or oneDNN not faster here): the output layer multiplies by the model's
    table, so mapping the lookup would free nothing."""
    model_dir = build(tmp_path / "model", tied=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.lm_head.weight = model.model.embed_tokens.weight  # tied here, whatever from_pretrained did
    assert map_input_embeddings(model, str(model_dir)) == 0
    # The same storage under another Parameter is the same table too.
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.data)
    assert map_input_embeddings(model, str(model_dir)) == 0
    assert type(model.get_input_embeddings()) is torch.nn.Embedding


def test_a_checkpoint_without_the_table_or_with_it_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = build(tmp_path / "model", tied=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pack_linears(model, rows_hint=8, min_speedup=0)
    monkeypatch.setenv("SURGE_MAP_EMBEDDINGS", "0")
    assert map_input_embeddings(model, str(model_dir)) == 0
    monkeypatch.delenv("SURGE_MAP_EMBEDDINGS")
    weights = load_file(model_dir / "model.safetensors")
    weights["model.embed_tokens.weight"] = weights.pop("model.embed_tokens.weight").T.contiguous()  # wrong shape
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    assert map_input_embeddings(model, str(model_dir)) == 0
    assert type(model.get_input_embeddings()) is torch.nn.Embedding


def test_the_header_names_where_the_tensor_lies(tmp_path: Path) -> None:
    table = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    save_file({"a": torch.zeros(5), "b.weight": table}, tmp_path / "model.safetensors")
    found = mapped_embedding.find_tensor(tmp_path, ["missing.weight", "b.weight"])
    assert found is not None and found.shape == (3, 4) and found.dtype == torch.bfloat16
    mapped, _ = mapped_embedding.map_tensor(found)
    assert torch.equal(mapped, table)
    assert mapped_embedding.find_tensor(tmp_path, ["missing.weight"]) is None


def test_a_table_already_in_the_files_pages_is_left_alone(tmp_path: Path) -> None:
    """bfloat16 from a bfloat16 file: what transformers reads in place is mapped already."""
    table = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    save_file({"b.weight": table}, tmp_path / "model.safetensors")
    found = mapped_embedding.find_tensor(tmp_path, ["b.weight"])
    assert found is not None
    mapped, _ = mapped_embedding.map_tensor(found)
    assert mapped_embedding.in_file_mapping(mapped.data_ptr())
    assert not mapped_embedding.in_file_mapping(table.data_ptr())


def test_an_unreadable_checkpoint_keeps_the_copy_rather_than_failing_the_load(tmp_path: Path) -> None:
    model_dir = build(tmp_path / "model", tied=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    (model_dir / "model.safetensors").write_bytes(b"\xff" * 16)  # a header length past any bound
    assert map_input_embeddings(model, str(model_dir)) == 0
    assert type(model.get_input_embeddings()) is torch.nn.Embedding
