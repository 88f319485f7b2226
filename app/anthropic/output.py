"""The Message object and its content blocks, as Anthropic's API returns them.

`stop_reason`: `tool_use` when the reply called tools, `max_tokens` when it was cut,
`stop_sequence` (with `stop_sequence` the one that matched) when one of the request's
`stop_sequences` ended it, else `end_turn`. Ids: `msg_` and `toolu_` with 24 random characters, as Anthropic's look.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Sequence
from typing import Any

from models import FinishReason

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str) -> str:
    return prefix + "_01" + "".join(secrets.choice(_ALPHABET) for _ in range(22))


def stop_reason(
    reason: FinishReason | None, num_calls: int, matched: str | int | None, asked: Sequence[str]
) -> tuple[str, str | None]:
    """(`stop_reason`, `stop_sequence`); `matched`: what the engine says ended the reply."""
    if reason is FinishReason.LENGTH:
        return "max_tokens", None
    if num_calls:
        return "tool_use", None
    if isinstance(matched, str) and matched in asked:
        return "stop_sequence", matched
    return "end_turn", None


def usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """Anthropic counts cached prompt tokens apart from `input_tokens`; nothing is written on request."""
    return {
        "input_tokens": input_tokens - cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": output_tokens,
    }


def message(message_id: str, model: str, content: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
        **fields,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object Anthropic's `tool_use` block carries."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
