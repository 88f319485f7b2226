"""--chat-template and a request's chat_template_kwargs reach the template."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from tests.live_server import MODEL_NAME, LiveServer, running_server

USER = [{"role": "user", "content": "Hello there"}]


def prompt_tokens(url: str, **request: object) -> int:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 1, **request}
    response = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens"])


def test_template_kwargs_reach_the_template(server: LiveServer) -> None:
    plain = prompt_tokens(server.url)
    # The tiny template closes an empty reasoning block when thinking is off, as Qwen3's does.
    assert prompt_tokens(server.url, chat_template_kwargs={"enable_thinking": False}) > plain
    assert prompt_tokens(server.url, chat_template_kwargs={"enable_thinking": True}) == plain
    # The template's own arguments cannot be replaced from a request.
    assert prompt_tokens(server.url, chat_template_kwargs={"add_generation_prompt": False}) == plain


def test_a_chat_template_file_replaces_the_models(tiny_model_dir: Path, tmp_path: Path) -> None:
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] ")
    with running_server(tiny_model_dir, max_model_len=256, max_num_seqs=2, chat_template=str(template)) as live:
        expected = len(live.engine.tokenizer.hf.encode("[user] Hello there\n[assistant] ", add_special_tokens=False))
        assert prompt_tokens(live.url) == expected


def test_a_missing_template_file_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nothing\.jinja"):
        Settings(chat_template=str(tmp_path / "nothing.jinja"))
