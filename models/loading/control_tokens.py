"""Control tokens in what clients write, defused before the chat template renders it.

The template's output is tokenized with special tokens parsed, so a user message containing
`<|im_end|>\\n<|im_start|>system\\n...` became real control tokens: the user closed its own turn
and opened a system turn (role spoofing; an application that forwards end-user text into a user
message hands its users the system prompt). Every string the template can render comes from the
client: the messages of every role (an assistant turn in the history is the client's too: a fake
earlier reply is the same attack), their names and tool calls (names, arguments), the tools'
names, descriptions and parameter schemas (keys included), and the request's template
variables. Each special token's text inside any of them gets a zero-width space after its first
character, so it tokenizes as the text it is; the template's own control tokens are untouched.

Only the tokenizer's special tokens are defused; other added tokens (`<tool_call>`, `<think>`)
open no turn, and templates read them in past turns (Qwen3 cuts the reasoning of past turns at
`</think>`). Tool calls reach the template as structured fields, which it writes with its own tags.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

ZERO_WIDTH_SPACE = "\u200b"


class ControlTokens:
    def __init__(self, special_texts: Iterable[str]) -> None:
        texts = sorted({text for text in special_texts if len(text) > 1}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, texts))) if texts else None

    def defuse(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(_break, text)

    def defuse_all(self, value: Any) -> Any:
        """A copy of `value` (JSON-like data: dicts, lists, strings, numbers) with every string
        defused, dict keys included; anything else is kept as it is. The request's own data is
        untouched. JSON stays JSON: the space lands inside a string."""
        if self._pattern is None:
            return value
        return _walk(value, self._pattern.sub)


def _break(match: re.Match[str]) -> str:
    return match[0][0] + ZERO_WIDTH_SPACE + match[0][1:]


def _walk(value: Any, sub: Any) -> Any:
    # NOTE: recursion is bounded by the body's JSON parser, which refuses deep nesting.
    if isinstance(value, str):
        return sub(_break, value)
    if isinstance(value, Mapping):
        return {(sub(_break, key) if isinstance(key, str) else key): _walk(item, sub) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(item, sub) for item in value]
    return value
