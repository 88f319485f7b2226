"""The embedding batching loop on the real tiny encoder: jobs that wait share a pass, a cancelled
job is dropped, the queue is bounded, and a failing pass fails its jobs, never the loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from models.embedding.batcher import EmbeddingEngine
from models.embedding.encoder import Encoder
from models.embedding.info import EmbeddingQueueFull


class _Gated(Encoder):
    """The real encoder, held at the start of each pass until the test opens the gate."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__(encoder.model, encoder.tokenizer, encoder.info)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.passes: list[int] = []
        self.fail_next = False

    def embed(self, inputs: list[list[int]], dimensions: list[int | None]) -> list[torch.Tensor]:
        self.entered.set()
        self.gate.wait(10)
        self.passes.append(len(inputs))
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("a failing pass")
        return super().embed(inputs, dimensions)


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder.load("tiny", device="cpu")


@pytest.fixture
def gated(encoder: Encoder) -> Iterator[tuple[_Gated, EmbeddingEngine]]:
    model = _Gated(encoder)
    engine = EmbeddingEngine(model, max_queued_tokens=64)
    yield model, engine
    model.gate.set()
    engine.stop()


def test_jobs_waiting_behind_a_pass_share_the_next(encoder: Encoder, gated: tuple[_Gated, EmbeddingEngine]) -> None:
    model, engine = gated
    texts = ["first", "the capital of France", "a quick brown fox", "hello world"]
    first = engine.submit([encoder.encode_text(texts[0])])
    assert model.entered.wait(10)  # the first pass runs (held), the next three wait
    rest = [engine.submit([encoder.encode_text(text)]) for text in texts[1:]]
    model.gate.set()
    results = [future.result(10) for future in [first, *rest]]
    assert model.passes == [1, 3]
    alone = encoder.embed([encoder.encode_text(text) for text in texts], [None] * 4)
    for (vector,), expected in zip(results, alone, strict=True):
        assert torch.allclose(torch.tensor(vector), expected, atol=1e-5)
    assert engine.stats.num_requests == 4 and engine.stats.num_batches == 2


def test_a_cancelled_job_is_dropped_and_the_queue_is_bounded(gated: tuple[_Gated, EmbeddingEngine]) -> None:
    model, engine = gated
    running = engine.submit([[5, 6, 7]])
    assert model.entered.wait(10)
    dropped = engine.submit([[8] * 30])
    kept = engine.submit([[9] * 30])
    with pytest.raises(EmbeddingQueueFull):
        engine.submit([[10] * 10])  # 60 waiting + 10 > 64
    assert engine.stats.num_rejected == 1
    assert dropped.cancel()
    model.gate.set()
    assert len(running.result(10)) == 1 and len(kept.result(10)) == 1
    assert model.passes == [1, 1]  # the cancelled job never ran
    assert engine.num_waiting_tokens == 0


def test_a_failing_pass_fails_its_jobs_and_the_loop_goes_on(gated: tuple[_Gated, EmbeddingEngine]) -> None:
    model, engine = gated
    model.fail_next = True
    model.gate.set()
    with pytest.raises(RuntimeError, match="a failing pass"):
        engine.submit([[1, 2, 3]]).result(10)
    assert len(engine.submit([[1, 2, 3]]).result(10)) == 1


def test_long_inputs_are_split_into_passes_of_bounded_padding(encoder: Encoder) -> None:
    model = _Gated(encoder)
    model.gate.set()
    engine = EmbeddingEngine(model, max_batch_tokens=512)
    try:
        inputs = [[7] * 500, [8] * 3, [9] * 4, [10] * 300]
        vectors = engine.submit(inputs).result(10)
        assert [len(vector) for vector in vectors] == [256] * 4
        # Sorted by length: 3 and 4 tokens together, then 300, then 500 (each alone within 512).
        assert model.passes == [2, 1, 1]
        for ids, vector in zip(inputs, vectors, strict=True):
            assert torch.allclose(torch.tensor(vector), encoder.embed([ids], [None])[0], atol=1e-5)
    finally:
        engine.stop()
