"""Prefix caching through the real server (engine in its own process, the openai SDK):
`usage.prompt_tokens_details.cached_tokens` in every response shape, the metrics, and one API
key's prompts never warming another's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from models.config import SchedulerConfig
from tests.app.ops.test_metrics import Scrape
from tests.live_server import MODEL_NAME, LiveServer, running_server

BLOCK = SchedulerConfig().prefix_cache_block_size
SEA = "The sea is wide and the waves roll in from the west, grey and green under a low sky. " * 6


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(
        tiny_model_dir,
        engine_mode="process",
        max_model_len=1024,
        max_num_seqs=4,
        api_key=("key-a", "key-b"),
        metrics_key="prometheus",
    ) as server:
        yield server


def client(live: LiveServer, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0)


def system() -> str:
    """A long system prompt no other test has sent: a fresh tag first."""
    return f"[{uuid.uuid4().hex}] You are a sailor. {SEA}"


def chat(live: LiveServer, system_text: str, user: str, key: str = "key-a") -> openai.types.chat.ChatCompletion:
    messages = [{"role": "system", "content": system_text}, {"role": "user", "content": user}]
    return client(live, key).chat.completions.create(
        model=MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
    )


def cached(usage: object) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    assert details is not None, usage
    return int(details.cached_tokens)


def test_a_chat_reuses_the_system_prompt_it_shares(live: LiveServer) -> None:
    text = system()
    first = chat(live, text, "Where is the harbour?")
    assert first.usage is not None and cached(first.usage) == 0
    second = chat(live, text, "What is the weather like?")
    assert second.usage is not None
    hit = cached(second.usage)
    assert hit % BLOCK == 0 and 100 < hit < second.usage.prompt_tokens


def test_the_streamed_usage_chunk_reports_cached_tokens(live: LiveServer) -> None:
    text = system()
    chat(live, text, "Hello")
    stream = client(live).chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "system", "content": text}, {"role": "user", "content": "Ahoy"}],
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and cached(chunks[-1].usage) > 100


def test_completions_report_cached_tokens_summed_over_prompts(live: LiveServer) -> None:
    head = system()
    prompts = [head + " One.", head + " Two."]
    completions = client(live).completions
    cold = completions.create(model=MODEL_NAME, prompt=[head + " Zero."], max_tokens=2, temperature=0)
    assert cold.usage is not None and cached(cold.usage) == 0
    warm = completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=2, temperature=0)
    assert warm.usage is not None
    assert cached(warm.usage) > 200  # both prompts reuse the shared head
    stream = completions.create(
        model=MODEL_NAME,
        prompt=head + " Three.",
        max_tokens=2,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    last = list(stream)[-1]
    assert last.usage is not None and cached(last.usage) > 100


def test_n_choices_report_the_cache_hit_of_their_prompt_not_of_each_other(live: LiveServer) -> None:
    text = system()
    reply = client(live).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "system", "content": text}], max_tokens=3, n=3, temperature=1.0
    )
    assert reply.usage is not None and cached(reply.usage) == 0  # the choices share; no earlier request did


def test_one_api_keys_prompts_never_warm_anothers(live: LiveServer) -> None:
    text = system()
    chat(live, text, "Where is the harbour?", key="key-a")
    other = chat(live, text, "Where is the harbour, please?", key="key-b")
    assert other.usage is not None and cached(other.usage) == 0
    same = chat(live, text, "Where is the harbour, please?", key="key-a")
    assert same.usage is not None and cached(same.usage) > 100


def test_metrics_count_queried_and_hit_tokens_and_the_pool(live: LiveServer) -> None:
    before = Scrape(live)
    text = system()
    chat(live, text, "One")
    second = chat(live, text, "Two")
    assert second.usage is not None
    after = Scrape(live)

    def delta(name: str) -> float:
        return after.value(name) - before.value(name)

    assert delta("surge_prefix_cache_hit_tokens_total") == cached(second.usage)
    assert delta("surge_prefix_cache_queried_tokens_total") >= second.usage.prompt_tokens
    used, capacity = after.value("surge_prefix_cache_used_bytes"), after.value("surge_prefix_cache_capacity_bytes")
    assert 0 < used <= capacity


def test_a_cache_salt_reuses_only_prefixes_cached_under_the_same_salt(live: LiveServer) -> None:
    text = system()

    def salted(user: str, salt: str | None) -> int:
        messages = [{"role": "system", "content": text}, {"role": "user", "content": user}]
        extra = {"cache_salt": salt} if salt is not None else {}
        reply = client(live).chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            max_tokens=2,
            temperature=0,
            extra_body=extra,  # type: ignore[arg-type]
        )
        assert reply.usage is not None
        return cached(reply.usage)

    assert salted("First?", "tenant-one-secret") == 0
    assert salted("Second?", "tenant-one-secret") > 100  # the same salt: the system prompt is reused
    assert salted("Third?", "tenant-two-secret") == 0  # another salt sees none of it
    assert salted("Fourth?", None) == 0  # nor does the key without a salt
    with pytest.raises(openai.BadRequestError):
        salted("Empty salt?", "")
