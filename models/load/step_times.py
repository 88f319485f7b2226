"""The engine's observer as the server gives it, with each decode step's time also kept for the load
figures: the degradation's step-time trigger reads them (models/load/stats.py).

One wrapper for both ways the engine runs: on a thread of this process it calls the observer
itself; in its own process its events are replayed into it on the event loop (models/process/parent.py).
"""

from __future__ import annotations

from models.engine.observer import EngineObserver
from models.kv.events import KvEvent
from models.load.stats import LoadStats
from models.scheduler.sequence import FinishReason


class StepTimesObserver:
    def __init__(self, inner: EngineObserver, stats: LoadStats) -> None:
        self._inner = inner
        self._stats = stats

    def on_step(self, num_seqs: int, num_prompt_tokens: int, num_generated_tokens: int, seconds: float) -> None:
        # Decode steps only: a step that prefills (a prompt, or a chunk of a long one beside the
        # decoding streams) is as slow as its prompt is long, not as loaded as the engine is: counted,
        # one long agent prompt (~18k tokens) held its own server at a degradation level that refuses it.
        if not num_prompt_tokens:
            self._stats.record_step(seconds)
        self._inner.on_step(num_seqs, num_prompt_tokens, num_generated_tokens, seconds)

    def on_admitted(self, queue_time: float) -> None:
        self._inner.on_admitted(queue_time)

    def on_first_token(self, ttft: float) -> None:
        self._inner.on_first_token(ttft)

    def on_token_gaps(self, gaps: list[float]) -> None:
        self._inner.on_token_gaps(gaps)

    def on_finish(self, reason: FinishReason, e2e: float) -> None:
        self._inner.on_finish(reason, e2e)

    def on_grammar_masks(self, seconds: float) -> None:
        self._inner.on_grammar_masks(seconds)

    def on_grammar_compiled(self, seconds: float) -> None:
        self._inner.on_grammar_compiled(seconds)

    def on_kv_events(self, events: list[KvEvent]) -> None:
        self._inner.on_kv_events(events)
