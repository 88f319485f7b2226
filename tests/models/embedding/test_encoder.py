"""The encoder's reading of a model directory: pooling, input length and shortened vectors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from models.embedding.encoder import Encoder
from models.embedding.info import EncoderInfo
from models.loading.tiny_encoder import ensure_tiny_encoder


def test_the_tiny_encoder_reads_as_sentence_transformers_says() -> None:
    encoder = Encoder.load("tiny", device="cpu")
    expected = EncoderInfo(max_input_tokens=512, dimensions=256, matryoshka=(), vocab_size=8192, pooling="mean")
    assert encoder.info == expected
    # Lower-cased before tokenizing: case never moves a vector.
    assert encoder.encode_text("The Capital Of FRANCE") == encoder.encode_text("the capital of france")


def test_cls_pooling_from_the_pooling_config(tmp_path: Path) -> None:
    directory = tmp_path / "cls"
    shutil.copytree(ensure_tiny_encoder(), directory)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    mean = Encoder.load("tiny", device="cpu")
    cls = Encoder.load(str(directory), device="cpu")
    assert cls.info.pooling == "cls" and cls.info.max_input_tokens == 128
    ids = mean.encode_text("a quick brown fox jumps")
    with torch.inference_mode():
        hidden = mean.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    assert torch.allclose(cls.embed([ids], [None])[0], torch.nn.functional.normalize(hidden[0], dim=0), atol=1e-5)
    assert torch.allclose(mean.embed([ids], [None])[0], torch.nn.functional.normalize(hidden.mean(0), dim=0), atol=1e-5)


def test_a_plain_encoder_directory_pools_by_mean_and_takes_no_dimensions(tmp_path: Path) -> None:
    directory = tmp_path / "plain"
    shutil.copytree(ensure_tiny_encoder(), directory)
    for extra in ("1_Pooling", "2_Normalize"):
        shutil.rmtree(directory / extra)
    (directory / "modules.json").unlink()
    (directory / "sentence_bert_config.json").unlink()
    config = json.loads((directory / "config.json").read_text())
    config.pop("is_matryoshka")
    (directory / "config.json").write_text(json.dumps(config))
    info = Encoder.load(str(directory), device="cpu").info
    assert info.pooling == "mean" and info.max_input_tokens == 512 and info.matryoshka is None
    assert info.check_dimensions(8) == "This model does not support specifying dimensions."


@pytest.mark.parametrize(
    ("matryoshka", "wanted", "refused"),
    [((), 8, False), ((), 257, True), ((64, 128), 64, False), ((64, 128), 100, True), (None, 8, True)],
)
def test_which_dimensions_a_model_allows(matryoshka: tuple[int, ...] | None, wanted: int, refused: bool) -> None:
    info = EncoderInfo(max_input_tokens=512, dimensions=256, matryoshka=matryoshka, vocab_size=10, pooling="mean")
    assert (info.check_dimensions(wanted) is not None) == refused
