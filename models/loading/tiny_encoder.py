"""The embedded tiny sentence encoder: a BERT body on the tiny models' tokenizer, built offline.

Owns building (and caching, once per recipe) a standard sentence-transformers directory:
config.json and model.safetensors of a `BertModel`, the tokenizer, `modules.json` and
`1_Pooling/config.json` (mean pooling, then normalization), so it loads through `AutoModel` as
any Hugging Face encoder does, and through `sentence-transformers` too.

What its vectors mean: the weights are random, but the position and token-type tables are zero
and the layers' updates small beside the residual stream, so a text's vector is about the mean of
its tokens' (normalized) embeddings: texts sharing most of their tokens (case aside: the tokenizer
lower-cases) come out close, texts sharing few come out far apart. A bag of tokens, not a model of
meaning; enough to serve `/v1/embeddings` and show similar-query merging offline. A real encoder
(any Hugging Face one) is one `--embedding-model` away.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import normalizers
from transformers import BertConfig, BertModel

from models.loading.tiny import BUILD_VERSION, ENDOFTEXT_ID, VOCAB_SIZE, _build_once, build_tokenizer, default_cache_dir

# Bump whenever this recipe changes (the tokenizer's is BUILD_VERSION), so cached builds are redone.
ENCODER_VERSION = 2
HIDDEN_SIZE = 256  # wide enough that unrelated texts' vectors are near orthogonal (cosine ~0 +- 0.06)
MAX_INPUT_TOKENS = 512
WEIGHT_SEED = 0


def build_tiny_encoder(out_dir: Path) -> Path:
    """Write the encoder's directory into `out_dir` and return it."""
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=MAX_INPUT_TOKENS,
        pad_token_id=ENDOFTEXT_ID,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        # As vLLM reads it: any `dimensions` up to the full size may be asked for (the first ones
        # of a bag of tokens are as good a summary as any).
        is_matryoshka=True,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Every draw under the seed: the same vectors from every build, whatever the process drew before.
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(WEIGHT_SEED)
        model = BertModel(config)  # with its pooler, unused, so AutoModel finds every weight it builds
        model.embeddings.position_embeddings.weight.zero_()
        model.embeddings.token_type_embeddings.weight.zero_()
        # Token vectors of unit scale (the embedding LayerNorm makes them so anyway), the layers'
        # own weights at their small initial scale: the residual stream carries the tokens through.
        model.embeddings.word_embeddings.weight.normal_(0.0, 1.0)
    model.save_pretrained(out_dir)
    tokenizer = build_tokenizer()
    tokenizer.backend_tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.model_max_length = MAX_INPUT_TOKENS
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(ENDOFTEXT_ID)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(out_dir)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out_dir / "modules.json").write_text(json.dumps(modules, indent=2))
    (out_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_INPUT_TOKENS}))
    pooling = {"word_embedding_dimension": HIDDEN_SIZE, "pooling_mode_mean_tokens": True}
    (out_dir / "1_Pooling").mkdir(exist_ok=True)
    (out_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (out_dir / "2_Normalize").mkdir(exist_ok=True)
    return out_dir


def ensure_tiny_encoder(cache_dir: Path | None = None) -> Path:
    """The cached build of the tiny encoder, built first if it is missing."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = f"tiny-encoder-v{BUILD_VERSION}.{ENCODER_VERSION}"
    return _build_once(root / name, build_tiny_encoder)
