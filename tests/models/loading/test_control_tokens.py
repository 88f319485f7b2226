"""Control tokens in client text: defused in every string the chat template may render."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from models.loading import tiny
from models.loading.control_tokens import ZERO_WIDTH_SPACE, ControlTokens
from models.loading.tokenizer import Tokenizer

CONTROL = ControlTokens(["<|im_start|>", "<|im_end|>", "[INST]", "<s>"])


def test_each_control_string_gets_a_zero_width_space_after_its_first_character() -> None:
    assert (
        CONTROL.defuse("a<|im_end|>b[INST]c<s>")
        == f"a<{ZERO_WIDTH_SPACE}|im_end|>b[{ZERO_WIDTH_SPACE}INST]c<{ZERO_WIDTH_SPACE}s>"
    )
    assert CONTROL.defuse("plain <b>text</b>") == "plain <b>text</b>"


def test_every_string_is_defused_keys_included_and_the_input_is_untouched() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "<|im_end|>"}], "name": "<s>"},
        {"role": "assistant", "content": "<|im_end|>", "tool_calls": [{"id": "[INST]", "function": {"<s>": 1}}]},
    ]
    out = CONTROL.defuse_all((messages, None, {"flag": True, "n": 3}))
    assert out[1:] == [None, {"flag": True, "n": 3}]
    user, assistant = out[0]
    assert user["content"][0]["text"] == f"<{ZERO_WIDTH_SPACE}|im_end|>" and ZERO_WIDTH_SPACE in user["name"]
    assert ZERO_WIDTH_SPACE in assistant["content"] and ZERO_WIDTH_SPACE in assistant["tool_calls"][0]["id"]
    assert list(assistant["tool_calls"][0]["function"]) == [f"<{ZERO_WIDTH_SPACE}s>"]
    assert messages[1]["content"] == "<|im_end|>"  # copies: the request's own data is untouched


def test_json_text_stays_the_same_json() -> None:
    arguments = json.dumps({"q": "<|im_end|>", "<s>": ["[INST]"]})
    assert json.loads(CONTROL.defuse(arguments)) == CONTROL.defuse_all(json.loads(arguments))


def test_a_tokenizer_without_special_tokens_changes_nothing() -> None:
    assert ControlTokens([]).defuse("<|im_start|>") == "<|im_start|>"
    value = {"a": ["<|im_start|>"]}
    assert ControlTokens([]).defuse_all(value) is value


def test_tags_that_are_not_special_tokens_are_kept() -> None:
    """`<think>` and `<tool_call>` are added tokens that open no turn; templates read them in past turns."""
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(tiny.ensure_tokenizer()))
    reply = "<think>\nplan\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    ids = tokenizer.encode_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}])
    assert {tiny.THINK_ID, tiny.THINK_END_ID, tiny.TOOL_CALL_ID, tiny.TOOL_CALL_END_ID} <= set(ids)


def test_a_reserved_template_variable_is_refused_by_the_renderer_too() -> None:
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(tiny.ensure_tokenizer()))
    assert {"bos_token", "eos_token", "pad_token", "unk_token", "messages", "tools"} <= (
        tokenizer.reserved_template_variables
    )
    with pytest.raises(ValueError, match="bos_token"):
        tokenizer.encode_chat([{"role": "user", "content": "hi"}], template_kwargs={"bos_token": "<|im_start|>"})
