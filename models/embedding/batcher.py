"""The embedding model's own batching loop: requests from the event loop, batches on one thread.

Owns the queue of embedding jobs and the thread that runs them. Each pass takes every job waiting
(up to `max_batch_tokens` of input), sorts their inputs by length so that padding stays small, runs
them in batches of at most `max_batch_tokens` padded tokens, and hands each job its vectors. A
request that arrives while a batch runs joins the next pass: many small requests share one
forward pass, as sequences share a decode step in the chat engine.

Bounded: past `max_queued_tokens` waiting, `submit` refuses (the server's 503), so a flood of
embeddings cannot grow memory without end. A job whose caller gave up (its future cancelled) is
dropped before it runs. The thread runs torch with its own thread count (OpenMP's is per thread),
so the chat engine's counts in this process are untouched.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from array import array
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from models.embedding.encoder import Encoder
from models.embedding.info import EmbeddingQueueFull, EmbeddingStats, EncoderInfo, vector_of

log = logging.getLogger("surge.embedding")

DEFAULT_MAX_BATCH_TOKENS = 16_384
DEFAULT_MAX_QUEUED_TOKENS = 1 << 20


@dataclass(slots=True)
class _Job:
    inputs: list[list[int]]
    dimensions: int | None
    future: Future[list[array[float]]]
    num_tokens: int


class EmbeddingEngine:
    """The embedding model on a batching thread of this process (an `Embedder`)."""

    def __init__(
        self,
        encoder: Encoder,
        *,
        threads: int = 1,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_queued_tokens: int = DEFAULT_MAX_QUEUED_TOKENS,
    ) -> None:
        self.encoder = encoder
        self._threads = threads
        self._max_batch_tokens = max(max_batch_tokens, encoder.info.max_input_tokens)
        self._max_queued_tokens = max_queued_tokens
        self._jobs: deque[_Job] = deque()
        self._queued_tokens = 0
        self._wake = threading.Condition()
        self._stopping = False
        self.stats = EmbeddingStats()
        self._thread = threading.Thread(target=self._run, name="surge-embedding", daemon=True)
        self._thread.start()

    @property
    def info(self) -> EncoderInfo:
        return self.encoder.info

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_waiting_tokens(self) -> int:
        return self._queued_tokens

    def encode_text(self, text: str) -> list[int]:
        return self.encoder.encode_text(text)

    def submit(self, inputs: list[list[int]], dimensions: int | None = None) -> Future[list[array[float]]]:
        """Queue one request's inputs; its future gets one vector per input, in order."""
        num_tokens = sum(len(ids) for ids in inputs)
        future: Future[list[array[float]]] = Future()
        with self._wake:
            if self._stopping:
                raise RuntimeError("the embedding engine is stopped")
            if self._jobs and self._queued_tokens + num_tokens > self._max_queued_tokens:
                self.stats.num_rejected += 1
                raise EmbeddingQueueFull(f"{self._queued_tokens} input tokens are already waiting")
            self._jobs.append(_Job(inputs, dimensions, future, num_tokens))
            self._queued_tokens += num_tokens
            self._wake.notify()
        return future

    async def embed(self, inputs: list[list[int]], dimensions: int | None = None) -> list[array[float]]:
        """`submit`, awaited; a caller that is cancelled (its client left) drops its job if it has
        not started."""
        future = self.submit(inputs, dimensions)
        try:
            return await asyncio.wrap_future(future)
        finally:
            future.cancel()  # no-op once done

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=10)
        for job in self._jobs:
            job.future.cancel()
        self._jobs.clear()

    def _take(self) -> list[_Job] | None:
        """Every job waiting, up to the batch's tokens (at least one job); None when stopping."""
        with self._wake:
            while not self._jobs and not self._stopping:
                self._wake.wait()
            if self._stopping:
                return None
            taken: list[_Job] = []
            num_tokens = 0
            while self._jobs and (not taken or num_tokens + self._jobs[0].num_tokens <= self._max_batch_tokens):
                job = self._jobs.popleft()
                self._queued_tokens -= job.num_tokens
                if job.future.set_running_or_notify_cancel():
                    taken.append(job)
                    num_tokens += job.num_tokens
            return taken

    def _run(self) -> None:
        torch.set_num_threads(self._threads)  # this thread's count only
        while (jobs := self._take()) is not None:
            if not jobs:
                continue
            started = time.perf_counter()
            try:
                results = self._embed_all(jobs)
            except Exception as exc:  # a bad batch fails its requests, never the loop
                log.exception("embedding batch failed")
                for job in jobs:
                    job.future.set_exception(exc)
                continue
            finally:
                self.stats.busy_seconds += time.perf_counter() - started
            for job, vectors in zip(jobs, results, strict=True):
                job.future.set_result(vectors)
                self.stats.num_requests += 1
                self.stats.num_inputs += len(job.inputs)
                self.stats.num_tokens += job.num_tokens

    def _embed_all(self, jobs: list[_Job]) -> list[list[array[float]]]:
        """Every input of `jobs`, shortest first, in batches of at most the batch's padded tokens."""
        entries = sorted(
            ((len(ids), j, i) for j, job in enumerate(jobs) for i, ids in enumerate(job.inputs)),
        )
        results: list[list[torch.Tensor | None]] = [[None] * len(job.inputs) for job in jobs]
        start = 0
        while start < len(entries):
            end = start + 1
            # Sorted by length: the batch's padded size is its last input's length x its size.
            while end < len(entries) and entries[end][0] * (end + 1 - start) <= self._max_batch_tokens:
                end += 1
            batch = entries[start:end]
            vectors = self.encoder.embed(
                [jobs[j].inputs[i] for _, j, i in batch], [jobs[j].dimensions for _, j, _ in batch]
            )
            for (_, j, i), vector in zip(batch, vectors, strict=True):
                results[j][i] = vector
            self.stats.num_batches += 1
            self.stats.num_batched_inputs += len(batch)
            start = end
        return [[vector_of(vector.numpy().tobytes()) for vector in row if vector is not None] for row in results]
