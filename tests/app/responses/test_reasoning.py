"""A reasoning model's thinking as Responses `reasoning` items and Anthropic `thinking` blocks,
whole and streamed, counted in `reasoning_tokens`. The template opens the block in the prompt
(DeepSeek-R1's way) and the random model never closes it: every output token is reasoning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.live_server import MODEL_NAME, LiveServer, running_server
from tests.openai_wire import assert_openai

BODY: dict[str, Any] = {"model": MODEL_NAME, "max_output_tokens": 10, "ignore_eos": True, "input": "2 + 2?"}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    template = tmp_path_factory.mktemp("r1") / "r1.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n<think>\n"
    )
    with running_server(tiny_model_dir, max_model_len=512, chat_template=str(template)) as live:
        yield live


def test_a_response_carries_its_reasoning_item_whole_and_streamed(server: LiveServer) -> None:
    whole = httpx.post(f"{server.url}/v1/responses", json=BODY, timeout=60).json()
    assert_openai(whole, "Response")
    reasoning = [item for item in whole["output"] if item["type"] == "reasoning"]
    assert len(reasoning) == 1 and reasoning[0]["id"].startswith("rs_") and reasoning[0]["content"][0]["text"]
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] > 0

    with httpx.stream("POST", f"{server.url}/v1/responses", json={**BODY, "stream": True}, timeout=60) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    for event in events:
        assert_openai(event, "ResponseStreamEvent")
    final = events[-1]["response"]
    (item,) = [item for item in final["output"] if item["type"] == "reasoning"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert deltas == item["content"][0]["text"] and final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def test_a_message_carries_its_thinking_block_whole_and_streamed(server: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    request: Any = {"model": MODEL_NAME, "max_tokens": 10, "messages": [{"role": "user", "content": "2 + 2?"}]}
    whole = client.messages.create(**request, extra_body={"ignore_eos": True})
    assert whole.content[0].type == "thinking" and whole.content[0].thinking
    with client.messages.stream(**request, extra_body={"ignore_eos": True}) as stream:
        final = stream.get_final_message()
    thinking = [block for block in final.content if block.type == "thinking"]
    assert thinking and thinking[0].thinking
