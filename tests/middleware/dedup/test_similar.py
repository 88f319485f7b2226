"""Similar-query merging: the index alone, then through a real server with the tiny encoder, the
openai SDK and API keys (near-duplicates merged, different questions, other keys, other contexts,
sampled requests and keys with merging off not)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from middleware.dedup.similar import SimilarQueries
from tests.live_server import MODEL_NAME, LiveServer, running_server


def test_the_index_finds_the_most_similar_live_query_of_its_group() -> None:
    now = [0.0]
    index = SimilarQueries(ttl=10, max_per_group=2, clock=lambda: now[0])
    index.add("g", [1.0, 0.0], "k1")
    index.add("g", [0.6, 0.8], "k2")
    assert index.find("g", [0.8, 0.6], 0.9) == ("k2", pytest.approx(0.96))
    assert index.find("g", [0.0, 1.0], 0.9) is None
    assert index.find("other", [1.0, 0.0], 0.5) is None
    index.add("g", [0.0, 1.0], "k3")  # the group keeps its last two
    assert index.find("g", [1.0, 0.0], 0.99) is None
    now[0] = 11.0  # past the TTL: gone, and the empty group with them
    assert index.find("g", [0.0, 1.0], 0.5) is None and len(index) == 0


QUERY = "What is the capital of France?"
NEAR = "What's the capital of France?"  # 0.87 by the tiny encoder
OTHER = "How do I sort a list in Python?"  # 0.12


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps({"sk-a": None, "sk-b": None, "sk-off": {"merge_similar": 0}}))
    with running_server(
        tiny_model_dir,
        max_model_len=512,
        merge_similar=0.8,
        keys_file=str(keys),
        metrics_key="m",
        embedding_model="tiny",
    ) as live:
        yield live


def _client(server: LiveServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def _ask(client: openai.OpenAI, text: str, system: str = "Be brief.", **extra: object) -> str:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    response = client.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        **extra,  # type: ignore[arg-type]
    )
    return str(response.choices[0].message.content)


def test_a_near_duplicate_shares_the_generation_and_a_different_question_does_not(server: LiveServer) -> None:
    similar = server.state.similar
    client = _client(server, "sk-a")
    first = _ask(client, QUERY)
    merged_before = similar.num_merged
    near = _ask(client, NEAR)
    assert near == first
    assert similar.num_merged == merged_before + 1
    # What the near-duplicate gets alone (its own generation) is another text: the merge gave it the first's.
    assert _ask(client, NEAR, extra_headers={"Cache-Control": "no-cache"}) != first
    other = _ask(client, OTHER)
    assert other != first and similar.num_merged == merged_before + 1
    metrics = server.scrape().text
    assert f'surge_similar_queries_merged_total{{model="{MODEL_NAME}"}} {float(similar.num_merged)}' in metrics


def test_never_across_keys_contexts_samples_or_keys_with_merging_off(server: LiveServer) -> None:
    similar = server.state.similar
    first = _ask(_client(server, "sk-a"), QUERY, system="Answer in one word.")
    before = similar.num_merged
    # Another key: its own group, so its own generation.
    assert _ask(_client(server, "sk-b"), NEAR, system="Answer in one word.") != first
    # Another conversation before the query: another group.
    _ask(_client(server, "sk-a"), NEAR, system="Answer at length.")
    # Sampled without a seed: not deterministic, never shared (as exact dedup).
    _client(server, "sk-a").chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": NEAR}],
        max_tokens=12,
        temperature=1.0,
    )
    # The key's own setting, 0: off.
    checked = similar.num_checked
    assert _ask(_client(server, "sk-off"), NEAR, system="Answer in one word.") != first
    assert similar.num_checked == checked
    assert similar.num_merged == before
    # And the same key, same context: merged.
    assert _ask(_client(server, "sk-a"), NEAR, system="Answer in one word.") == first
    assert similar.num_merged == before + 1


def test_completions_merge_too(server: LiveServer) -> None:
    client = _client(server, "sk-b")
    first = client.completions.create(model=MODEL_NAME, prompt=QUERY, max_tokens=10, temperature=0)
    before = server.state.similar.num_merged
    near = client.completions.create(model=MODEL_NAME, prompt=NEAR, max_tokens=10, temperature=0)
    assert near.choices[0].text == first.choices[0].text
    assert server.state.similar.num_merged == before + 1


def test_merging_needs_an_embedding_model_and_dedup(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="needs an embedding model"):
        running_server(tiny_model_dir, merge_similar=0.9, embedding_model="").__enter__()
    with pytest.raises(ValueError, match="needs an embedding model"):
        running_server(tiny_model_dir, merge_similar=0.9, dedup_ttl_seconds=0, embedding_model="tiny").__enter__()
