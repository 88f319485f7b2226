"""The Message object and its content blocks, as Anthropic's API returns them.

`stop_reason`: `tool_use` when the reply called tools, `max_tokens` when it was cut, else
`end_turn` (a stop sequence's match is not told apart from the model's own end: `stop_sequence`
stays null). Ids: `msg_` and `toolu_` with 24 random characters, as Anthropic's look.
"""

from __future__ import annotations

import json
import secrets
import string
from typing import Any

from models import FinishReason

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str) -> str:
    return prefix + "_01" + "".join(secrets.choice(_ALPHABET) for _ in range(22))


def stop_reason(reason: FinishReason | None, num_calls: int) -> str:
    if reason is FinishReason.LENGTH:
        return "max_tokens"
    return "tool_use" if num_calls else "end_turn"


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
