"""The Llama 3 JSON parser on Llama 3.1 / 3.2's real output strings, whole and streamed."""

from __future__ import annotations

import pytest

from app.tools.formats import FORMATS
from tests.app.tools.streaming import shape, splits, streamed

LLAMA3 = FORMATS["llama3_json"]

CASES = [
    # Llama 3.1 8B Instruct, JSON tool calling as its model card documents it.
    (
        '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}}',
        None,
        [("get_current_conditions", '{"location": "San Francisco, CA", "unit": "Fahrenheit"}')],
    ),
    # With the python tag kept by the decoder, and two calls separated by "; " (Llama 3.2).
    (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"tz": "CET"}}',
        None,
        [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "CET"}')],
    ),
    # Leading whitespace and a newline after the call.
    ('\n\n{"name": "now", "parameters": {}}\n', None, [("now", "{}")]),
    # Plain answers, including ones with braces later on.
    ("The capital of France is Paris.", "The capital of France is Paris.", []),
    ("Use {braces} like this: {}", "Use {braces} like this: {}", []),
    # An object that is not a call stays content.
    ('{"city": "Paris"}', '{"city": "Paris"}', []),
    ("{not json at all", "{not json at all", []),
    # Text after the calls is kept.
    ('{"name": "f", "parameters": {"a": 1}} Done.', "Done.", [("f", '{"a": 1}')]),
]


@pytest.mark.parametrize(("output", "content", "calls"), CASES)
def test_whole_and_streamed_replies(output: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    assert shape(LLAMA3.parse(output)) == (content, calls)
    for pieces in splits(output, seed=len(output)):
        assert shape(streamed(LLAMA3, pieces)) == (content, calls), pieces
