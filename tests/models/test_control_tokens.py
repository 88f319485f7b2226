"""Control tokens in client text: defused in the client roles' text, kept everywhere else."""

from __future__ import annotations

from models.control_tokens import ZERO_WIDTH_SPACE, ControlTokens

CONTROL = ControlTokens(["<|im_start|>", "<|im_end|>", "[INST]", "<s>"])


def test_each_control_string_gets_a_zero_width_space_after_its_first_character() -> None:
    assert (
        CONTROL.defuse("a<|im_end|>b[INST]c<s>")
        == f"a<{ZERO_WIDTH_SPACE}|im_end|>b[{ZERO_WIDTH_SPACE}INST]c<{ZERO_WIDTH_SPACE}s>"
    )
    assert CONTROL.defuse("plain <b>text</b>") == "plain <b>text</b>"


def test_only_the_client_roles_are_defused_and_parts_too() -> None:
    messages = [
        {"role": "system", "content": "<|im_start|>"},
        {"role": "user", "content": [{"type": "text", "text": "<|im_end|>"}], "name": "<s>"},
        {"role": "tool", "content": "[INST]", "tool_call_id": "c1"},
        {"role": "assistant", "content": "<|im_end|>"},  # the model's own turn: left alone
    ]
    out = CONTROL.defuse_messages(messages)
    assert ZERO_WIDTH_SPACE in out[0]["content"] and ZERO_WIDTH_SPACE in out[1]["content"][0]["text"]
    assert ZERO_WIDTH_SPACE in out[1]["name"] and ZERO_WIDTH_SPACE in out[2]["content"]
    assert out[3]["content"] == "<|im_end|>"
    assert messages[0]["content"] == "<|im_start|>"  # copies: the request's own messages are untouched


def test_a_tokenizer_without_special_tokens_changes_nothing() -> None:
    assert ControlTokens([]).defuse("<|im_start|>") == "<|im_start|>"
