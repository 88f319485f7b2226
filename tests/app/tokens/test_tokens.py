"""vLLM's /tokenize, /detokenize and render endpoints through a real server: the ids are the ones the
server prefills for the same request (a chat request's usage counts them), text comes back whole,
bad input is a 400 in OpenAI's shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.live_server import MODEL_NAME, LiveServer, running_server

MESSAGES: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is the harbour?"}]
MAX_MODEL_LEN = 1024


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=MAX_MODEL_LEN) as server:
        yield server


def post(live: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{live.url}{path}", json=body, timeout=30)


def test_a_chat_conversation_tokenizes_and_renders_to_what_chat_prefills(live: LiveServer) -> None:
    tokenized = post(live, "/tokenize", {"model": MODEL_NAME, "messages": MESSAGES}).json()
    rendered = post(live, "/v1/chat/completions/render", {"model": MODEL_NAME, "messages": MESSAGES}).json()
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=1)
    assert chat.usage is not None
    assert tokenized["tokens"] == rendered["token_ids"] and tokenized["count"] == chat.usage.prompt_tokens
    assert tokenized["max_model_len"] == MAX_MODEL_LEN and tokenized["token_strs"] is None
    params = rendered["sampling_params"]
    assert params["max_tokens"] == MAX_MODEL_LEN - tokenized["count"] and params["n"] == 1  # the context's rest
    assert rendered["model"] == MODEL_NAME and rendered["request_id"].startswith("chatcmpl-")
    # Without the generation prompt: the conversation alone, a prefix of the prompt.
    bare = post(live, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()["tokens"]
    assert bare == tokenized["tokens"][: len(bare)] and len(bare) < tokenized["count"]


def test_a_prompt_tokenizes_and_detokenizes_back(live: LiveServer) -> None:
    text = "The sea is wide and the waves roll in."
    tokenized = post(live, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) == len(tokenized["token_strs"]) > 3
    assert post(live, "/detokenize", {"model": MODEL_NAME, "tokens": tokenized["tokens"]}).json() == {"prompt": text}
    rendered = post(live, "/v1/completions/render", {"model": MODEL_NAME, "prompt": [text, "Other."], "max_tokens": 5})
    first, second = rendered.json()
    assert first["token_ids"] == tokenized["tokens"] and first["sampling_params"]["max_tokens"] == 5
    assert second["token_ids"] != first["token_ids"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "not-served", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"text": "neither form"}, 400, None),
        ("/detokenize", {"tokens": [10**6]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, None),
        ("/v1/chat/completions/render", {"model": MODEL_NAME, "messages": []}, 400, None),
        ("/v1/completions/render", {"model": MODEL_NAME, "prompt": "x", "max_tokens": MAX_MODEL_LEN}, 400, "prompt"),
    ],
)
def test_bad_input_is_a_clear_error(live: LiveServer, path: str, body: dict[str, Any], status: int, param: str) -> None:
    response = post(live, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and (param is None or error["param"] == param)
