"""What the server knows of an embedding model without torch: its shape (`EncoderInfo`), its
counters (`EmbeddingStats`), and the one interface (`Embedder`) that the in-process batching loop
(batcher.py) and the embedding process (process.py) both offer the server.

NOTE: torch-free on purpose: with the engines in their own processes the server's process never
imports torch (models/process/spawn.py); this module and process.py are all it loads of embeddings.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Protocol


class EmbeddingQueueFull(RuntimeError):
    """Too much is already waiting: the caller should retry later."""


@dataclass(frozen=True, slots=True)
class EncoderInfo:
    """What the server needs to know of an encoder to validate requests for it."""

    max_input_tokens: int
    dimensions: int
    # None: `dimensions` may not be asked; empty: any from 1 to `dimensions`; else only these.
    matryoshka: tuple[int, ...] | None
    vocab_size: int
    pooling: str

    def check_dimensions(self, wanted: int) -> str | None:
        """Why `wanted` dimensions cannot be served, or None when they can."""
        if self.matryoshka is None:
            return "This model does not support specifying dimensions."
        if wanted < 1 or wanted > self.dimensions:
            return f"dimensions must be from 1 to {self.dimensions} for this model."
        if self.matryoshka and wanted not in self.matryoshka:
            return f"This model supports dimensions {', '.join(map(str, self.matryoshka))} only."
        return None


@dataclass(slots=True)
class EmbeddingStats:
    """Counters since start, read by the metrics."""

    num_requests: int = 0
    num_inputs: int = 0
    num_tokens: int = 0
    num_batches: int = 0
    busy_seconds: float = 0.0
    num_rejected: int = 0
    num_batched_inputs: int = 0  # / num_batches: the mean batch


class Embedder(Protocol):
    """An embedding model at work: on a thread of this process, or in a process of its own."""

    @property
    def info(self) -> EncoderInfo: ...

    @property
    def stats(self) -> EmbeddingStats: ...

    @property
    def num_waiting_tokens(self) -> int: ...

    @property
    def is_alive(self) -> bool:
        """False once its process or thread has ended: it never comes back (the liveness probe says so)."""
        ...

    def encode_text(self, text: str) -> list[int]:
        """A text's token ids as the model reads them (with its special tokens)."""
        ...

    async def embed(self, inputs: list[list[int]], dimensions: int | None = None) -> list[array[float]]:
        """One unit vector (float32s) per input, in order; EmbeddingQueueFull when too much waits."""
        ...

    def stop(self) -> None: ...


def vector_of(raw: bytes) -> array[float]:
    """float32s from their bytes in this machine's order (what crosses the process pipe)."""
    vector = array("f")
    vector.frombytes(raw)
    return vector
