"""examples/curl.sh: the non-streaming and `curl -N` streaming one-liners."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.examples.conftest import EXAMPLES, run_example
from tests.live_server import LiveServer


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("bash") is None, reason="needs curl and bash")
def test_curl_prints_a_completion_then_a_stream_ending_in_done(examples_server: LiveServer) -> None:
    out = run_example(["bash", str(EXAMPLES / "curl.sh")], examples_server.url).stdout
    plain, _, streamed = out.partition("== streaming")
    body = json.loads(plain.removeprefix("== non-streaming").strip())
    assert body["object"] == "chat.completion"
    assert_ended_properly(body["choices"][0]["finish_reason"], body["usage"]["completion_tokens"])
    events = [line.removeprefix("data: ") for line in streamed.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finish = [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]][-1]
    assert chunks[-1]["choices"] == []
    assert_ended_properly(finish, chunks[-1]["usage"]["completion_tokens"])


def assert_ended_properly(finish_reason: str, completion_tokens: int) -> None:
    """The example samples (no temperature: OpenAI's default 1.0), so the model may pick its end token
    before max_tokens (16); then it stops early and says so."""
    ended_early = finish_reason == "stop" and 0 < completion_tokens < 16
    assert (finish_reason, completion_tokens) == ("length", 16) or ended_early
