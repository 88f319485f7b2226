"""The Hermes / Qwen parser on Qwen2.5's and Hermes' real output strings, whole and streamed in
every split (one character at a time, cut at random points): both give the same reply."""

from __future__ import annotations

import pytest

from app.tools.calls import CallStart
from app.tools.formats import FORMATS
from tests.app.tools.streaming import shape, splits, streamed

HERMES = FORMATS["hermes"]

# (model output, content, [(name, arguments)])
CASES = [
    # Qwen2.5's documented parallel calls.
    (
        '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_temperature_date", "arguments": {"location": "San Francisco, '
        'CA, USA", "date": "2024-10-01"}}\n</tool_call>',
        None,
        [
            ("get_current_temperature", '{"location": "San Francisco, CA, USA"}'),
            ("get_temperature_date", '{"location": "San Francisco, CA, USA", "date": "2024-10-01"}'),
        ],
    ),
    # Text first, then a call (Hermes-2-Pro style); the newline before the tag is not content.
    (
        'Let me look that up.\n<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}'
        "\n</tool_call>",
        "Let me look that up.",
        [("get_stock_fundamentals", '{"symbol": "TSLA"}')],
    ),
    # Plain text is unchanged, whitespace and angle brackets included.
    ("The answer is 3 < 4, and <b>bold</b>.\n\n", "The answer is 3 < 4, and <b>bold</b>.\n\n", []),
    # Nested arguments with braces, brackets and escapes inside strings.
    (
        '<tool_call>\n{"name": "run", "arguments": {"code": "if x: {\\"a\\": [1, 2]}\\n}", '
        '"n": [1, {"b": null}]}}\n</tool_call>',
        None,
        [("run", '{"code": "if x: {\\"a\\": [1, 2]}\\n}", "n": [1, {"b": null}]}')],
    ),
    # Arguments written as a JSON string (some fine-tunes do): decoded into OpenAI's string.
    (
        '<tool_call>\n{"name": "f", "arguments": "{\\"q\\": 1}"}\n</tool_call>',
        None,
        [("f", '{"q": 1}')],
    ),
    # No arguments at all: "{}".
    ('<tool_call>\n{"name": "now"}\n</tool_call>', None, [("now", "{}")]),
    # The closing tag left out.
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}', None, [("f", '{"a": 1}')]),
    # Text after the calls is kept.
    (
        'Sure.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nDone.',
        "Sure.Done.",
        [("f", "{}")],
    ),
    # A tag with no call inside stays in the content, as written.
    ("<tool_call>\nI cannot call tools.\n</tool_call>", "<tool_call>\nI cannot call tools.\n</tool_call>", []),
    ('<tool_call>\n{"city": "Rome"}\n</tool_call>', '<tool_call>\n{"city": "Rome"}\n</tool_call>', []),
    ("I tried: \n<tool_call>\n{oops}", "I tried: \n<tool_call>\n{oops}", []),
    # A partial opening tag at the end is text.
    ("Use <tool_ca", "Use <tool_ca", []),
]


@pytest.mark.parametrize(("output", "content", "calls"), CASES)
def test_whole_and_streamed_replies(output: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    assert shape(HERMES.parse(output)) == (content, calls)
    for seed, pieces in enumerate(splits(output, seed=len(output))):
        assert shape(streamed(HERMES, pieces)) == (content, calls), (seed, pieces)


def test_a_call_is_announced_once_its_name_is_complete() -> None:
    stream = HERMES.stream()
    assert stream.push('<tool_call>\n{"name": "get_wea') == []
    events = stream.push('ther", "arguments": {"ci')
    assert isinstance(events[0], CallStart) and events[0].name == "get_weather" and events[0].index == 0
    assert events[1:] and "".join(e.text for e in events[1:]) == '{"ci'  # type: ignore[union-attr]


def test_cut_inside_the_arguments_keeps_what_there_is() -> None:
    reply = HERMES.parse('<tool_call>\n{"name": "f", "arguments": {"city": "Par')
    assert shape(reply) == (None, [("f", '{"city": "Par')])


def test_each_call_has_its_own_id() -> None:
    reply = HERMES.parse(CASES[0][0])
    assert len({call.id for call in reply.calls}) == 2
    assert all(call.id.startswith("call_") and len(call.id) == 29 for call in reply.calls)
