"""models/loading/file_pages.py: once loaded, a model whose weights are copies (packed, 8-bit)
keeps none of the checkpoint's pages resident through transformers' mapping of the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from models.config import ModelConfig
from models.loading import file_pages
from models.loading.loader import load_model
from tests.models.loading.test_mapped_embedding import build, logits
from tests.models.loading.test_widening import resident_kib


def test_an_int8_model_read_in_the_files_dtype_leaves_the_files_pages(tmp_path: Path) -> None:
    """bfloat16 with int8 weights from a bfloat16 file: every weight first lies in the load's
    mapping; the 8-bit layers are copies, the table gets a mapping of its own, the norms are
    copied out, and the load's mapping goes (before, all of its pages stayed resident)."""
    model_dir = build(tmp_path / "model", tied=False)
    checkpoint = (model_dir / "model.safetensors").resolve()
    loaded = load_model(ModelConfig(model=str(model_dir), dtype="bfloat16", quantization="int8"))
    assert loaded.model is not None
    assert resident_kib(checkpoint) < checkpoint.stat().st_size // 1024 // 4
    out = logits(loaded.model)
    assert torch.isfinite(out).all()


def test_a_model_that_reads_the_mapping_keeps_it(tmp_path: Path) -> None:
    """bfloat16 weights used in place (no packing): the mapping is the model's memory; copying it
    all out would only trade file pages for anonymous ones."""
    model_dir = build(tmp_path / "model", tied=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    ranges = file_pages.file_ranges()
    weight = model.model.layers[0].mlp.up_proj.weight
    assert file_pages.in_ranges(weight.data_ptr(), ranges)  # read in place
    expected = logits(model)
    assert file_pages.copy_out_of_files(model, max_bytes=1024) == 0
    assert file_pages.in_ranges(model.model.layers[0].mlp.up_proj.weight.data_ptr(), file_pages.file_ranges())
    copied = file_pages.copy_out_of_files(model)  # the toy model is under the default bound
    assert copied == sum(t.numel() * t.element_size() for t in model.parameters())
    ranges = file_pages.file_ranges()
    assert not any(file_pages.in_ranges(t.data_ptr(), ranges) for t in model.parameters())
    assert torch.equal(logits(model), expected)


@pytest.mark.parametrize(("address", "inside"), [(99, False), (100, True), (199, True), (200, False), (350, True)])
def test_an_address_is_found_among_sorted_ranges(address: int, inside: bool) -> None:
    assert file_pages.in_ranges(address, [(100, 200), (300, 400)]) is inside
