"""The engine's tokenizer wrapper: chat template, decode, and exact token bytes for logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from models.loading import tiny
from models.loading.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer(AutoTokenizer.from_pretrained(tiny_model_dir))


def test_token_bytes_join_to_the_exact_utf8_of_the_text(tokenizer: Tokenizer) -> None:
    text = "naïve café 日本語 🎉👩‍👩‍👧 done"
    ids = tokenizer.encode(text)
    assert any(tokenizer.token_text(i) == "\ufffd" for i in ids), "expected a token that splits a character"
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode()


def test_chat_template_ends_with_the_generation_prompt(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert tokenizer.hf.decode(ids).endswith("<|im_start|>assistant\n")


def test_decode_skips_special_tokens(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode_chat([{"role": "user", "content": "hello"}])
    assert "<|im_start|>" not in tokenizer.decode(ids)
    assert "hello" in tokenizer.decode(ids)


def test_decode_keeping_keeps_only_the_named_special_tokens() -> None:
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(tiny.ensure_tokenizer()))
    ids = [tiny.IM_START_ID, *tokenizer.encode("hi"), tiny.IM_END_ID]
    assert tokenizer.decode(ids) == "hi"
    assert tokenizer.decode_keeping(ids, {tiny.IM_START_ID}) == "<|im_start|>hi"
    assert tokenizer.special_token_id("<|im_start|>") == tiny.IM_START_ID
    assert tokenizer.special_token_id("<tool_call>") is None  # an added token, but not a special one
    assert tokenizer.special_token_id("hello") is None
