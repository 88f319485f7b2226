"""The Responses and Messages bodies' bounds: on lists, never on a string's characters."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.anthropic.request import MessagesRequest
from app.openai.limits import MAX_CONTENT_PARTS, MAX_MESSAGES
from app.responses.request import ResponsesRequest


def test_a_long_string_input_is_accepted() -> None:
    """Regression: the list's bound (4,096 items) once applied to a string input's characters,
    so any prompt over 4,096 characters (Codex's are ~70,000) was a 400."""
    assert ResponsesRequest.model_validate({"model": "m", "input": "x" * 100_000}).input == "x" * 100_000


def test_input_lists_are_bounded() -> None:
    too_many = [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)
    with pytest.raises(ValidationError):
        ResponsesRequest.model_validate({"model": "m", "input": too_many})


def test_a_messages_content_is_bounded_in_blocks_not_characters() -> None:
    long = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * 100_000}]}
    assert MessagesRequest.model_validate(long)
    blocks = [{"type": "text", "text": "x"}] * (MAX_CONTENT_PARTS + 1)
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate(
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": blocks}]}
        )
