"""A sentence encoder: token ids in, one unit vector per input out.

Owns loading an embedding model (the embedded tiny one, any Hugging Face encoder directory or hub
id: BERT, RoBERTa, XLM-R, or a decoder body such as Qwen3-Embedding's) and running one padded
batch through it. How a text becomes one vector follows the directory's sentence-transformers
files where it has them (`1_Pooling/config.json`: CLS, mean or last-token pooling;
`sentence_bert_config.json`: the input length); without them, mean pooling. Every vector is
normalized, as OpenAI's are, so a dot product is the cosine.

Shortened vectors (`dimensions`) follow vLLM: only a model that says it was trained for them
(`is_matryoshka` or `matryoshka_dimensions` in its config) may be asked; the first `dimensions`
values are kept and normalized again.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from models.embedding.info import EncoderInfo
from models.loading.loader import resolve_device, resolve_model_path

log = logging.getLogger("surge.embedding")

TINY_ENCODER = "tiny"
POOLINGS = ("mean", "cls", "last")
# Tokenizers without a real bound say 1e30; the model's positions bound them then.
_NO_LIMIT = 1_000_000


class Encoder:
    """One loaded embedding model and its tokenizer; `embed` runs on whichever thread calls it."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, info: EncoderInfo) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.device = next(model.parameters()).device

    @classmethod
    def load(cls, model: str, *, device: str = "auto", revision: str = "", attempts: int = 5) -> Encoder:
        """`tiny` (built offline), a directory or a hub id; on the GPU when `device` picks one."""
        started = time.perf_counter()
        if model == TINY_ENCODER:
            from models.loading.tiny_encoder import ensure_tiny_encoder

            path = str(ensure_tiny_encoder())
        else:
            path = resolve_model_path(model, revision, attempts)
        where = resolve_device(device)
        dtype = torch.float32 if where.type == "cpu" else torch.bfloat16
        config = AutoConfig.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        module = AutoModel.from_pretrained(path, dtype=dtype, device_map=where).eval()
        info = EncoderInfo(
            max_input_tokens=_max_input_tokens(Path(path), config, tokenizer),
            dimensions=int(config.hidden_size),
            matryoshka=_matryoshka(config),
            vocab_size=int(config.vocab_size),
            pooling=_pooling(Path(path), config),
        )
        log.info(
            "loaded embedding model %s in %.1f s: %d dimensions, %d input tokens, %s pooling",
            Path(path).name or path,
            time.perf_counter() - started,
            info.dimensions,
            info.max_input_tokens,
            info.pooling,
        )
        return cls(module, tokenizer, info)

    def encode_text(self, text: str) -> list[int]:
        """A text's token ids as the model was trained to read them (with its special tokens)."""
        ids: list[int] = self.tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"]
        return ids

    @torch.inference_mode()
    def embed(self, inputs: list[list[int]], dimensions: list[int | None]) -> list[torch.Tensor]:
        """One normalized float32 vector (on the CPU) per input; inputs are non-empty token id lists
        within the model's length and vocabulary (the caller checked)."""
        longest = max(len(ids) for ids in inputs)
        ids = torch.full((len(inputs), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(inputs), longest), dtype=torch.long)
        for row, tokens in enumerate(inputs):
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, : len(tokens)] = 1
        hidden = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
        hidden = hidden.float()
        if self.info.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.info.pooling == "last":
            last = mask.sum(dim=1).to(self.device) - 1  # right padding: each row's last real token
            pooled = hidden[torch.arange(len(inputs), device=self.device), last]
        else:
            weights = mask.to(self.device, hidden.dtype).unsqueeze(-1)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1)
        pooled = pooled.cpu()
        vectors = []
        for row, wanted in enumerate(dimensions):
            vector = pooled[row] if wanted is None else pooled[row, :wanted]
            vectors.append(torch.nn.functional.normalize(vector, dim=0))
        return vectors


def _max_input_tokens(path: Path, config: object, tokenizer: PreTrainedTokenizerBase) -> int:
    bounds = []
    settings = path / "sentence_bert_config.json"
    if settings.is_file():
        length = json.loads(settings.read_text()).get("max_seq_length")
        if isinstance(length, int) and length > 0:
            bounds.append(length)
    if 0 < tokenizer.model_max_length < _NO_LIMIT:
        bounds.append(int(tokenizer.model_max_length))
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        # RoBERTa's and XLM-R's tables start at pad id + 1: 514 positions, 512 tokens.
        offset = 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
        bounds.append(positions - offset)
    return min(bounds) if bounds else 512


def _matryoshka(config: object) -> tuple[int, ...] | None:
    listed = getattr(config, "matryoshka_dimensions", None)
    if listed:
        return tuple(sorted(int(d) for d in listed))
    return () if getattr(config, "is_matryoshka", False) else None


def _pooling(path: Path, config: object) -> str:
    """CLS, mean or last-token pooling, as the sentence-transformers files say; else by the body:
    a decoder's last token has seen the whole text, an encoder's mean is the common default."""
    pooling = path / "1_Pooling" / "config.json"
    if pooling.is_file():
        modes = json.loads(pooling.read_text())
        if modes.get("pooling_mode_cls_token"):
            return "cls"
        if modes.get("pooling_mode_lasttoken"):
            return "last"
        return "mean"
    return "last" if getattr(config, "is_decoder", False) else "mean"
