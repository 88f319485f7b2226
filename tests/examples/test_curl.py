"""examples/curl.sh: the non-streaming and `curl -N` streaming one-liners."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.app.conftest import LiveServer
from tests.examples.conftest import EXAMPLES, run_example


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("bash") is None, reason="needs curl and bash")
def test_curl_prints_a_completion_then_a_stream_ending_in_done(examples_server: LiveServer) -> None:
    out = run_example(["bash", str(EXAMPLES / "curl.sh")], examples_server.url).stdout
    plain, _, streamed = out.partition("== streaming")
    body = json.loads(plain.removeprefix("== non-streaming").strip())
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 16
    events = [line.removeprefix("data: ") for line in streamed.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 16
