"""Reasoning apart from content, on Qwen3's and DeepSeek-R1's real reply shapes, whole and streamed;
and through the server: reasoning_content in the message and in the deltas."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from app.reasoning import ReasoningStream, prompt_opens_reasoning, split_reasoning, template_reasons
from app.tools.calls import ContentDelta
from models.loading import tiny
from tests.app.tools.streaming import splits
from tests.live_server import MODEL_NAME, running_server

CASES = [
    # Qwen3 with thinking on: the model opens the block itself.
    (
        "<think>\nThe user greets me. I should greet back.\n</think>\n\nHello! How can I help?",
        False,
        "\nThe user greets me. I should greet back.\n",
        "Hello! How can I help?",
    ),
    # DeepSeek-R1: the prompt ends with "<think>\n", the reply starts inside the block.
    ("Okay, 2 + 2 is 4.\n</think>\n\nThe answer is **4**.", True, "Okay, 2 + 2 is 4.\n", "The answer is **4**."),
    # Qwen3 with enable_thinking=False, or any plain model: no block, content unchanged.
    ("Hi there.\n", False, None, "Hi there.\n"),
    ("I like </think> tags.", False, None, "I like </think> tags."),
    # Cut short (max_tokens) inside the block: all reasoning.
    ("<think>\nStill thinking about", False, "\nStill thinking about", ""),
    ("Thinking <thi", True, "Thinking <thi", ""),
    # An empty block.
    ("<think>\n\n</think>\n\nDone.", False, "\n\n", "Done."),
]


@pytest.mark.parametrize(("text", "in_reasoning", "reasoning", "content"), CASES)
def test_whole_and_streamed(text: str, in_reasoning: bool, reasoning: str | None, content: str) -> None:
    assert split_reasoning(text, in_reasoning=in_reasoning) == (reasoning, content)
    for pieces in splits(text, seed=len(text)):
        stream = ReasoningStream(in_reasoning=in_reasoning)
        events = [event for piece in pieces for event in stream.push(piece)] + stream.end()
        got_content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        got_reasoning = "".join(e.text for e in events if not isinstance(e, ContentDelta))
        assert (got_reasoning or None, got_content) == (reasoning, content), pieces


def test_which_templates_and_prompts_reason() -> None:
    assert template_reasons(tiny.CHAT_TEMPLATE)
    assert not template_reasons("{{ messages[0]['content'] }}")
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_reasoning_content_through_the_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    template = tmp_path / "r1.jinja"  # DeepSeek-R1's way: the generation prompt opens the block
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n<think>\n"
    )
    with running_server(tiny_model_dir, max_model_len=512, max_num_seqs=2, chat_template=str(template)) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
        request = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "2 + 2?"}],
            "max_tokens": 40,
            "seed": 3,
            "logit_bias": {str(tiny.THINK_END_ID): 7},  # the random model closes the block soon
        }
        whole = client.chat.completions.create(**request).choices[0].message  # type: ignore[call-overload]
        reasoning = whole.model_extra["reasoning_content"]
        assert reasoning and "</think>" not in reasoning
        assert whole.content is not None
        body = {**request, "stream": True}
        with httpx.stream(
            "POST", f"{live.url}/v1/chat/completions", json=body, headers={"Cache-Control": "no-cache"}
        ) as response:
            deltas = [
                json.loads(line[6:])["choices"][0]["delta"]
                for line in response.iter_lines()
                if line.startswith("data: {")
            ]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning
        assert "".join(d.get("content") or "" for d in deltas) == whole.content
