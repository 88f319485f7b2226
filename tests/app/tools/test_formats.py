"""Which format a chat template writes, and --tool-call-parser's names."""

from __future__ import annotations

import pytest

from app.tools.formats import FORMATS, format_for
from models.loading.tiny import CHAT_TEMPLATE

# The telling lines of real templates (Mistral's v3 and Llama 3.1's).
MISTRAL_TEMPLATE = "{%- if message['tool_calls'] is defined %}{{- '[TOOL_CALLS] [' }}"
LLAMA3_TEMPLATE = "{{- '<|start_header_id|>ipython<|end_header_id|>' }}{{- '<|python_tag|>' }}"


@pytest.mark.parametrize(
    ("template", "name"),
    [(CHAT_TEMPLATE, "hermes"), (MISTRAL_TEMPLATE, "mistral"), (LLAMA3_TEMPLATE, "llama3_json"), (None, "hermes")],
)
def test_the_template_decides(template: str | None, name: str) -> None:
    assert format_for(template).name == name


def test_a_name_overrides_the_template() -> None:
    assert format_for(CHAT_TEMPLATE, "mistral") is FORMATS["mistral"]
    with pytest.raises(KeyError):
        format_for(CHAT_TEMPLATE, "nope")
