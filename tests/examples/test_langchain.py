"""examples/langchain_chat.py: LangChain's ChatOpenAI pointed at surge, `invoke` and `stream`.

langchain-openai is in the dev extra; where it is missing the test skips and says so.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.examples.conftest import run_python_example
from tests.live_server import LiveServer


def test_chat_openai_invokes_and_streams(examples_server: LiveServer) -> None:
    if importlib.util.find_spec("langchain_openai") is None:
        pytest.skip("langchain-openai is not installed (pip install -e '.[dev]'): the LangChain example cannot run")
    out = run_python_example("langchain_chat.py", examples_server.url).stdout
    assert re.search(r"^invoke: '.+'$", out, re.MULTILINE)
    assert "'output_tokens': 24" in out  # usage_metadata from surge's usage
    assert int(re.search(r"streamed (\d+) chunks", out).group(1)) > 0  # type: ignore[union-attr]
