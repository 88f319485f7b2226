"""Control tokens in what clients write, defused before the chat template renders it.

The template's output is tokenized with special tokens parsed, so a user message containing
`<|im_end|>\\n<|im_start|>system\\n...` became real control tokens: the user closed its own turn
and opened a system turn (role spoofing; an application that forwards end-user text into a user
message hands its users the system prompt). Here each special token's text inside the content of
a system, developer, user or tool message gets a zero-width space after its first character, so
it tokenizes as the text it is. Assistant turns are left alone: they are the model's own output,
and templates read tags in them (Qwen3 cuts the reasoning of past turns at `</think>`). Only the
tokenizer's special tokens are defused; other added tokens (`<tool_call>`, `<think>`) open no turn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ZERO_WIDTH_SPACE = "\u200b"
_CLIENT_ROLES = frozenset({"system", "developer", "user", "tool"})


class ControlTokens:
    def __init__(self, special_texts: Iterable[str]) -> None:
        texts = sorted({text for text in special_texts if len(text) > 1}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, texts))) if texts else None

    def defuse(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda match: match[0][0] + ZERO_WIDTH_SPACE + match[0][1:], text)

    def defuse_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Copies of `messages` (chat-template dicts) with the client roles' text defused."""
        out = []
        for message in messages:
            message = dict(message)
            if message.get("role") in _CLIENT_ROLES:
                content = message.get("content")
                if isinstance(content, str):
                    message["content"] = self.defuse(content)
                elif isinstance(content, list):
                    message["content"] = [self._defuse_part(part) for part in content]
                if isinstance(message.get("name"), str):
                    message["name"] = self.defuse(message["name"])
            out.append(message)
        return out

    def _defuse_part(self, part: Any) -> Any:
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            return {**part, "text": self.defuse(part["text"])}
        return part
