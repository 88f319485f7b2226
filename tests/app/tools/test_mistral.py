"""The Mistral parser on both of Mistral's formats (v3 arrays, v11 name[ARGS]), whole and streamed."""

from __future__ import annotations

import pytest

from app.tools.formats import FORMATS
from tests.app.tools.streaming import shape, splits, streamed

MISTRAL = FORMATS["mistral"]

CASES = [
    # Mistral-7B-Instruct-v0.3 (tokenizer v3): a JSON array after the tag.
    (
        '[TOOL_CALLS] [{"name": "get_current_weather", '
        '"arguments": {"location": "Paris, France", "format": "celsius"}}]',
        None,
        [("get_current_weather", '{"location": "Paris, France", "format": "celsius"}')],
    ),
    (
        '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": [2, 3]}}]',
        None,
        [("a", '{"x": 1}'), ("b", '{"y": [2, 3]}')],
    ),
    # Mistral Small 3.1 / Large 2411 (tokenizer v11): name, [ARGS], arguments; one tag per call.
    (
        '[TOOL_CALLS]get_current_weather[ARGS]{"location": "Paris, France", "format": "celsius"}',
        None,
        [("get_current_weather", '{"location": "Paris, France", "format": "celsius"}')],
    ),
    (
        '[TOOL_CALLS]a[ARGS]{"x": {"n": "}"}}[TOOL_CALLS]b[CALL_ID]abc123xyz[ARGS]{}',
        None,
        [("a", '{"x": {"n": "}"}}'), ("b", "{}")],
    ),
    # Content before the tag.
    (
        'Let me check.[TOOL_CALLS] [{"name": "f", "arguments": {}}]',
        "Let me check.",
        [("f", "{}")],
    ),
    # No tag: content, brackets and all.
    ("[1, 2, 3] are numbers.", "[1, 2, 3] are numbers.", []),
    ("A partial [TOOL_CA", "A partial [TOOL_CA", []),
]


@pytest.mark.parametrize(("output", "content", "calls"), CASES)
def test_whole_and_streamed_replies(output: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    assert shape(MISTRAL.parse(output)) == (content, calls)
    for pieces in splits(output, seed=len(output)):
        assert shape(streamed(MISTRAL, pieces)) == (content, calls), pieces
