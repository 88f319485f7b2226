"""POST /v1/embeddings through a real server and the openai SDK, on the embedded tiny encoder."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from app.embeddings.request import MAX_INPUTS
from tests.live_server import MODEL_NAME, LiveServer, running_server

EMBEDDING = "tiny-embedding"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=256, max_num_seqs=4, embedding_model="tiny") as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float64)


def test_the_sdk_gets_unit_vectors_in_order_with_usage(client: openai.OpenAI, server: LiveServer) -> None:
    texts = ["What is the capital of France?", "How do I sort a list in Python?", "hello"]
    # The SDK asks for base64 unless told otherwise, and decodes it.
    response = client.embeddings.create(model=EMBEDDING, input=texts)
    assert response.model == EMBEDDING and response.object == "list"
    assert [item.index for item in response.data] == [0, 1, 2]
    vectors = _vectors(response)
    assert vectors.shape == (3, 256)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    encoder = server.state.embeddings  # type: ignore[union-attr]
    expected_tokens = sum(len(encoder.encode_text(text)) for text in texts)
    assert response.usage.prompt_tokens == response.usage.total_tokens == expected_tokens
    # The same request as JSON floats: the same vectors.
    floats = client.embeddings.create(model=EMBEDDING, input=texts, encoding_format="float")
    assert np.allclose(_vectors(floats), vectors, atol=1e-7)
    # Alone or in a batch, a text gets the same vector (padding does not leak into it).
    alone = client.embeddings.create(model=EMBEDDING, input=texts[2])
    assert np.allclose(_vectors(alone)[0], vectors[2], atol=1e-5)


def test_base64_is_little_endian_float32(server: LiveServer) -> None:
    body = {"model": EMBEDDING, "input": "hello", "encoding_format": "base64"}
    packed = httpx.post(f"{server.url}/v1/embeddings", json=body).json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(packed), dtype="<f4")
    floats = httpx.post(f"{server.url}/v1/embeddings", json={**body, "encoding_format": "float"}).json()
    assert decoded.tolist() == floats["data"][0]["embedding"]


def test_token_ids_embed_as_their_text_does(client: openai.OpenAI, server: LiveServer) -> None:
    encoder = server.state.embeddings  # type: ignore[union-attr]
    texts = ["a quick brown fox", "the capital of France"]
    ids = [encoder.encode_text(text) for text in texts]
    by_text = _vectors(client.embeddings.create(model=EMBEDDING, input=texts))
    by_ids = _vectors(client.embeddings.create(model=EMBEDDING, input=ids))
    one = _vectors(client.embeddings.create(model=EMBEDDING, input=ids[0]))
    assert np.allclose(by_ids, by_text, atol=1e-6)
    assert np.allclose(one[0], by_text[0], atol=1e-6)


def test_dimensions_keep_the_first_values_renormalized(client: openai.OpenAI) -> None:
    full = _vectors(client.embeddings.create(model=EMBEDDING, input="the capital of France"))[0]
    short = _vectors(client.embeddings.create(model=EMBEDDING, input="the capital of France", dimensions=8))[0]
    assert short.shape == (8,)
    assert np.allclose(short, full[:8] / np.linalg.norm(full[:8]), atol=1e-5)


def test_near_duplicates_are_closer_than_different_questions(client: openai.OpenAI) -> None:
    texts = ["What is the capital of France?", "what is the capital city of france", "How do I sort a list in Python?"]
    a, b, c = _vectors(client.embeddings.create(model=EMBEDDING, input=texts))
    assert a @ b > 0.75 > 0.3 > a @ c


def test_truncation_keeps_the_last_tokens(client: openai.OpenAI, server: LiveServer) -> None:
    encoder = server.state.embeddings  # type: ignore[union-attr]
    ids = (encoder.encode_text("one two three four five ") * 60)[:600]
    response = client.embeddings.create(model=EMBEDDING, input=ids, extra_body={"truncate_prompt_tokens": -1})
    assert response.usage.prompt_tokens == 512
    last = client.embeddings.create(model=EMBEDDING, input=ids[-512:])
    assert np.allclose(_vectors(response), _vectors(last), atol=1e-6)
    ten = client.embeddings.create(model=EMBEDDING, input=ids, extra_body={"truncate_prompt_tokens": 10})
    assert ten.usage.prompt_tokens == 10


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        ({"model": MODEL_NAME, "input": "x"}, 400, "model", "does not support embeddings"),
        ({"model": "no-such-model", "input": "x"}, 404, "model", "does not exist"),
        ({"model": EMBEDDING, "input": ""}, 400, "input", "empty"),
        ({"model": EMBEDDING, "input": []}, 400, "input", "not empty"),
        ({"model": EMBEDDING, "input": ["a", ""]}, 400, "input", "empty string"),
        ({"model": EMBEDDING, "input": [[1, 2], []]}, 400, "input", "empty list"),
        ({"model": EMBEDDING, "input": ["a", 3]}, 400, "input", "input must be"),
        ({"model": EMBEDDING, "input": ["a"] * (MAX_INPUTS + 1)}, 400, "input", "at most 2048"),
        ({"model": EMBEDDING, "input": [8192]}, 400, "input", "outside the model's vocabulary"),
        ({"model": EMBEDDING, "input": [-1]}, 400, "input", None),
        ({"model": EMBEDDING, "input": "word " * 600}, 400, "input", "maximum context length is 512"),
        ({"model": EMBEDDING, "input": "x" * 100_000}, 400, "input", "maximum context length is 512"),
        ({"model": EMBEDDING, "input": "x", "dimensions": 257}, 400, "dimensions", "from 1 to 256"),
        ({"model": EMBEDDING, "input": "x", "dimensions": 0}, 400, "dimensions", None),
        ({"model": EMBEDDING, "input": "x", "encoding_format": "int8"}, 400, "encoding_format", None),
        ({"model": EMBEDDING, "input": "x", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens", None),
        ({"input": "x"}, 400, "model", None),
    ],
)
def test_bad_requests_get_the_protocols_error_before_any_work(
    server: LiveServer, body: dict[str, object], status: int, param: str, says: str | None
) -> None:
    before = server.state.embeddings.stats.num_requests  # type: ignore[union-attr]
    response = httpx.post(f"{server.url}/v1/embeddings", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"].split(".")[0] == param
    assert error["type"] == "invalid_request_error"
    if says is not None:
        assert says in error["message"]
    assert server.state.embeddings.stats.num_requests == before  # type: ignore[union-attr]


def test_generation_routes_refuse_the_embedding_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        client.chat.completions.create(model=EMBEDDING, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        client.completions.create(model=EMBEDDING, prompt="hi", max_tokens=2)


def test_models_lists_and_retrieves_both(client: openai.OpenAI) -> None:
    listed = {model.id: model for model in client.models.list().data}
    assert set(listed) == {MODEL_NAME, EMBEDDING}
    card = client.models.retrieve(EMBEDDING)
    assert card.id == EMBEDDING
    assert card.model_extra == {"root": EMBEDDING, "max_model_len": 512, "dimensions": 256}
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME


def test_concurrent_requests_share_forward_passes_and_count_in_metrics(server: LiveServer) -> None:
    stats = server.state.embeddings.stats  # type: ignore[union-attr]
    requests, batches = stats.num_requests, stats.num_batches
    texts = [f"question number {i} about the capital of France" for i in range(48)]

    def embed(text: str) -> list[float]:
        body = {"model": EMBEDDING, "input": text, "encoding_format": "float"}
        response = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=30)
        response.raise_for_status()
        vector: list[float] = response.json()["data"][0]["embedding"]
        return vector

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        vectors = list(pool.map(embed, texts))
    assert all(math.isclose(float(np.linalg.norm(v)), 1.0, abs_tol=1e-5) for v in vectors)
    assert stats.num_requests - requests == 48
    # Joined while another pass ran: fewer passes than requests (each alone would be 48).
    assert stats.num_batches - batches < 48
    metrics = server.scrape().text
    assert f'surge_embedding_requests_total{{model="{EMBEDDING}"}}' in metrics
    assert f'surge_embedding_tokens_waiting{{model="{EMBEDDING}"}} 0.0' in metrics


def test_the_tokens_bucket_is_charged(tiny_model_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-small": {"tpm": 40}}))
    with running_server(tiny_model_dir, max_model_len=256, keys_file=str(keys), embedding_model="tiny") as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-small", max_retries=0)
        first = client.embeddings.create(model=EMBEDDING, input="one two three four five six seven eight nine ten")
        assert first.usage.prompt_tokens >= 10
        with pytest.raises(openai.RateLimitError):
            for _ in range(5):
                client.embeddings.create(model=EMBEDDING, input="one two three four five six seven eight nine ten")
        denied = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            denied.embeddings.create(model=EMBEDDING, input="x")


def test_without_an_embedding_model(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, max_model_len=256, embedding_model="") as live:
        assert live.state.embeddings is None
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
        assert [model.id for model in client.models.list().data] == [MODEL_NAME]
        with pytest.raises(openai.BadRequestError, match="it is a chat model"):
            client.embeddings.create(model=MODEL_NAME, input="x")
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model=EMBEDDING, input="x")
