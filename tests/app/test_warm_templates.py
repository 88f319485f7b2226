"""Warm templates (--warm-templates) through a real server: the very first request that starts
with a template reuses it, for every API key; it stays while other prompts flood the cache and
evict each other; a key's own prompts still never reach another key; a bad file stops the start."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from app.config.settings import Settings
from app.runtime.warm_templates import load_templates
from app.server.factory import create_app
from models import SchedulerConfig
from tests.app.ops.test_metrics import Scrape
from tests.live_server import MODEL_NAME, LiveServer, running_server

BLOCK = SchedulerConfig().prefix_cache_block_size
SYSTEM = "You are the harbour master's assistant. Answer about tides, moorings and fees. " * 8
PROMPT = "Translate the following sailing terms into French, one per line, with no comment:\n" * 4


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    templates = tmp_path_factory.mktemp("warm") / "templates.json"
    templates.write_text(json.dumps([{"messages": [{"role": "system", "content": SYSTEM}]}, {"prompt": PROMPT}]))
    with running_server(
        tiny_model_dir,
        engine_mode="process",
        max_model_len=1024,
        max_num_seqs=2,
        api_key=("key-a", "key-b"),
        metrics_key="prometheus",
        warm_templates=str(templates),
        prefix_cache_size="50%",  # of 2 x 1,024 tokens: 64 blocks of 16, a few prompts' worth
    ) as server:
        yield server


def client(live: LiveServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0)


def chat_cached(live: LiveServer, system: str, user: str, key: str) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of a chat request."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    reply = client(live, key).chat.completions.create(
        model=MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=2,
        temperature=0,
    )
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return int(reply.usage.prompt_tokens_details.cached_tokens or 0), reply.usage.prompt_tokens


def test_the_first_chat_of_every_key_reuses_the_template(live: LiveServer) -> None:
    for key in ("key-a", "key-b"):
        cached, prompt_tokens = chat_cached(live, SYSTEM, f"When is high tide? {uuid.uuid4().hex}", key)
        assert cached >= 4 * BLOCK and cached % BLOCK == 0 and cached < prompt_tokens, (key, cached)
    pinned = Scrape(live).value("surge_prefix_cache_pinned_bytes")
    assert pinned > 0


def test_a_completion_reuses_the_prompt_template(live: LiveServer) -> None:
    reply = client(live, "key-b").completions.create(
        model=MODEL_NAME, prompt=PROMPT + "mast\nsail\n", max_tokens=2, temperature=0
    )
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    assert (reply.usage.prompt_tokens_details.cached_tokens or 0) >= 2 * BLOCK


def test_the_template_outlives_a_flood_that_evicts_everything_else(live: LiveServer) -> None:
    """Other prompts evict each other (the pool holds a few) but never the template's blocks."""
    own = f"[{uuid.uuid4().hex}] You keep the lighthouse log. " * 12
    chat_cached(live, own, "First entry?", "key-a")
    assert chat_cached(live, own, "Second entry?", "key-a")[0] > 0  # cached while the pool has room
    for _ in range(10):  # ~9 blocks each: more than the pool's unpinned part
        flood = f"[{uuid.uuid4().hex}] You count the gulls on the pier. " * 12
        chat_cached(live, flood, "How many?", "key-a")
    assert chat_cached(live, own, "Third entry?", "key-a")[0] == 0  # evicted by the flood
    cached, _ = chat_cached(live, SYSTEM, f"Mooring fees? {uuid.uuid4().hex}", "key-a")
    assert cached >= 4 * BLOCK


def test_a_keys_own_continuation_of_the_template_never_reaches_another_key(live: LiveServer) -> None:
    """key-a's conversation after the template is cached for key-a alone: key-b reuses the
    template's blocks only."""
    user = f"My boat is the {uuid.uuid4().hex} and it needs a berth for the winter, please. " * 3
    template_only, _ = chat_cached(live, SYSTEM, "x", "key-b")
    chat_cached(live, SYSTEM, user, "key-a")
    assert chat_cached(live, SYSTEM, user, "key-a")[0] > template_only
    assert chat_cached(live, SYSTEM, user, "key-b")[0] == template_only


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        '[{"messages": []}]',
        '[{"prompt": ""}]',
        '[{"prompt": "a", "messages": [{"role": "system", "content": "b"}]}]',
        '[{"messages": [{"role": "system", "content": ["parts"]}]}]',
        '[{"text": "a"}]',
    ],
)
def test_a_bad_templates_file_stops_the_start_naming_the_fault(tmp_path: Path, content: str) -> None:
    path = tmp_path / "templates.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="--warm-templates"):
        load_templates(str(path))
    with pytest.raises(ValueError, match="--warm-templates"):
        create_app(Settings(model="echo", warm_templates=str(path)))
