"""The engine's observer hook: what the engine thread reports as it works, for metrics.

The engine calls these from its own thread, once per step or once per event, never per
request in a loop of its own; an implementation must be thread-safe and cheap (a counter or
histogram update), and must not block. The engine knows nothing of who listens: the app
wires a Prometheus implementation in; without one the engine reports to `NULL_OBSERVER`.
"""

from __future__ import annotations

from typing import Protocol

from models.kv.events import KvEvent
from models.scheduler.sequence import FinishReason


class EngineObserver(Protocol):
    def on_step(self, num_seqs: int, num_prompt_tokens: int, num_generated_tokens: int, seconds: float) -> None:
        """A step ran the model on `num_seqs` sequences: prompt tokens prefilled, tokens sampled, and
        the `seconds` its forward pass and sampling took (what each decoding sequence waited)."""

    def on_admitted(self, queue_time: float) -> None:
        """A request left the queue for the batch after `queue_time` seconds."""

    def on_first_token(self, ttft: float) -> None:
        """A request's first token, `ttft` seconds after it reached the engine."""

    def on_token_gaps(self, gaps: list[float]) -> None:
        """Seconds between each decoding sequence's previous token and the one of this step."""

    def on_finish(self, reason: FinishReason, e2e: float) -> None:
        """A request ended (not aborted), `e2e` seconds after it reached the engine."""

    def on_grammar_masks(self, seconds: float) -> None:
        """A step spent `seconds` computing the token masks of its constrained rows."""

    def on_grammar_compiled(self, seconds: float) -> None:
        """A grammar not seen before took `seconds` to compile (the server's check of it)."""

    def on_kv_events(self, events: list[KvEvent]) -> None:
        """The prefix cache stored, evicted or cleared blocks (only with `kv_events` on)."""


class NullObserver:
    """An observer that keeps nothing: the engine's default, so it never asks whether one listens."""

    def on_step(self, num_seqs: int, num_prompt_tokens: int, num_generated_tokens: int, seconds: float) -> None:
        pass

    def on_admitted(self, queue_time: float) -> None:
        pass

    def on_first_token(self, ttft: float) -> None:
        pass

    def on_token_gaps(self, gaps: list[float]) -> None:
        pass

    def on_finish(self, reason: FinishReason, e2e: float) -> None:
        pass

    def on_grammar_masks(self, seconds: float) -> None:
        pass

    def on_grammar_compiled(self, seconds: float) -> None:
        pass

    def on_kv_events(self, events: list[KvEvent]) -> None:
        pass


NULL_OBSERVER: EngineObserver = NullObserver()


class WarmupObserver(NullObserver):
    """Warmup's observer: keeps the time of its widest decode step (every slot, unless a KV bound
    kept them apart), the engine's pace at full load; the step-time degradation signal is read
    against it (middleware/admission/degradation.py)."""

    def __init__(self) -> None:
        self.rows = 0
        self.full_step_seconds = 0.0

    def on_step(self, num_seqs: int, num_prompt_tokens: int, num_generated_tokens: int, seconds: float) -> None:
        if num_prompt_tokens == 0 and (num_seqs, seconds) > (self.rows, self.full_step_seconds):
            self.rows, self.full_step_seconds = num_seqs, seconds
