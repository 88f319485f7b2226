"""The embedding model's figures, read at scrape time from its batching loop's counters, and
similar-query merging's, which uses it.

The embedding model's series are labelled with its own name (`model`), so they never mix with
the chat model's (none when no embedding model is served); merging's with the chat model's, whose
generations it merges.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.runtime.state import ServerState


class EmbeddingCollector(Collector):
    def __init__(self, state: ServerState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        similar, chat_model = self._state.similar, self._state.settings.model_name
        for name, doc, value in (
            (
                "surge_similar_queries_checked_total",
                "Requests whose query was embedded and compared for similar-query merging (--merge-similar).",
                similar.num_checked,
            ),
            (
                "surge_similar_queries_merged_total",
                "Of them, those given a similar query's generation instead of one of their own.",
                similar.num_merged,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=["model"])
            family.add_metric([chat_model], value)
            yield family
        embeddings = self._state.embeddings
        if embeddings is None:
            return
        model = self._state.settings.embedding_model_name
        stats = embeddings.stats
        counters: tuple[tuple[str, str, float], ...] = (
            ("surge_embedding_requests_total", "Embedding requests answered.", stats.num_requests),
            ("surge_embedding_inputs_total", "Inputs embedded (a request holds one or more).", stats.num_inputs),
            ("surge_embedding_tokens_total", "Input tokens embedded.", stats.num_tokens),
            ("surge_embedding_batches_total", "Forward passes of the embedding model.", stats.num_batches),
            (
                "surge_embedding_batched_inputs_total",
                "Inputs over all forward passes: over surge_embedding_batches_total, the mean batch.",
                stats.num_batched_inputs,
            ),
            (
                "surge_embedding_busy_seconds_total",
                "Seconds the embedding model spent in forward passes.",
                stats.busy_seconds,
            ),
            (
                "surge_embedding_rejected_total",
                "Embedding requests refused (503) because the embedding queue was full.",
                stats.num_rejected,
            ),
        )
        for name, doc, amount in counters:
            family = CounterMetricFamily(name, doc, labels=["model"])
            family.add_metric([model], amount)
            yield family
        waiting = GaugeMetricFamily(
            "surge_embedding_tokens_waiting", "Input tokens queued for the embedding model.", labels=["model"]
        )
        waiting.add_metric([model], embeddings.num_waiting_tokens)
        yield waiting
