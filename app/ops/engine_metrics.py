"""The engine's figures as Prometheus histograms and counters: `EngineMetrics`, the engine's
observer, updated from the engine's thread (or its process's receiver).

Histogram and counter updates are thread-safe and take no allocation beyond the engine's own list
of gaps per step. Names are a contract (the HPA, the adapter rules and the dashboard use them):
change them only with k8s/.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.registry import Collector

from app.ops.vllm_names import VllmNamed
from models import FinishReason, KvEvent

# From a small model's CPU decode step (a few ms) to a long generation on a busy GPU (a minute).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0)
# One token apart: from a tiny model's CPU decode step to a large model's on a busy GPU.
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# A batch's grammar masks: tens of microseconds for a few rows of a small vocabulary, milliseconds
# for a full batch of a 150k vocabulary. Compiling: under a millisecond to a large schema's second.
GRAMMAR_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class EngineFamilies:
    """The engine's histogram and counter families, once per registry: every served model's
    `EngineMetrics` is one `model` label of them. They reach `registry` through `VllmNamed`, which
    adds vLLM's names for those that have one."""

    def __init__(self, registry: CollectorRegistry) -> None:
        families: list[Collector] = []

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            family = Histogram(name, doc, ["model"], registry=None, buckets=buckets)
            families.append(family)
            return family

        def counter(name: str, doc: str, labels: list[str]) -> Counter:
            family = Counter(name, doc, labels, registry=None)
            families.append(family)
            return family

        self.ttft = histogram(
            "surge_time_to_first_token_seconds", "Seconds from reaching the engine to the first token.", LATENCY_BUCKETS
        )
        self.token_gap = histogram(
            "surge_inter_token_latency_seconds", "Seconds between consecutive tokens of a sequence.", TOKEN_GAP_BUCKETS
        )
        self.e2e = histogram(
            "surge_e2e_request_latency_seconds",
            "Seconds from reaching the engine to the last token (or error), per sequence.",
            LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "surge_queue_time_seconds", "Seconds a sequence waited in the engine's queue.", LATENCY_BUCKETS
        )
        self.batch_size = histogram(
            "surge_batch_size", "Sequences in one engine step (decodes and prefill chunks).", BATCH_BUCKETS
        )
        self.step_time = histogram(
            "surge_engine_step_seconds",
            "Seconds of one engine step's forward pass and sampling: what each decoding sequence waits per token.",
            TOKEN_GAP_BUCKETS,
        )
        self.prompt_tokens = counter("surge_prompt_tokens", "Prompt tokens prefilled.", ["model"])
        self.generation_tokens = counter("surge_generation_tokens", "Tokens generated.", ["model"])
        self.finished = counter(
            "surge_requests_finished",
            "Sequences ended, by finish reason (stop, length, error, rejected: dropped after "
            "waiting too long); aborted ones are in surge_requests_aborted_total.",
            ["model", "finish_reason"],
        )
        self.grammar_masks = histogram(
            "surge_grammar_mask_seconds",
            "Seconds computing one engine step's token masks for its constrained rows (beside its forward pass).",
            GRAMMAR_BUCKETS,
        )
        self.grammar_compile = histogram(
            "surge_grammar_compile_seconds",
            "Seconds a grammar not seen before (a new schema) took to check and compile.",
            GRAMMAR_BUCKETS,
        )
        registry.register(VllmNamed(families))


class EngineMetrics:
    """One served model's engine observer: its label of the families, updated from its engine's
    thread (or its process's receiver)."""

    def __init__(self, families: EngineFamilies, model: str) -> None:
        self.ttft = families.ttft.labels(model)
        self.token_gap = families.token_gap.labels(model)
        self.e2e = families.e2e.labels(model)
        self.queue_time = families.queue_time.labels(model)
        self.batch_size = families.batch_size.labels(model)
        self.step_time = families.step_time.labels(model)
        self.prompt_tokens = families.prompt_tokens.labels(model)
        self.generation_tokens = families.generation_tokens.labels(model)
        # Every reason exists from the start (at 0), so rate() works from the first scrape.
        self.finished: dict[FinishReason, Counter] = {
            reason: families.finished.labels(model, reason.value)
            for reason in FinishReason
            if reason is not FinishReason.ABORT
        }
        self.grammar_masks = families.grammar_masks.labels(model)
        self.grammar_compile = families.grammar_compile.labels(model)
        # Where the prefix cache's block events go (app/ops/kv_events.py), when they are published.
        self.kv_events: Callable[[list[KvEvent]], None] | None = None

    def on_step(self, num_seqs: int, num_prompt_tokens: int, num_generated_tokens: int, seconds: float) -> None:
        self.batch_size.observe(num_seqs)
        self.step_time.observe(seconds)
        if num_prompt_tokens:
            self.prompt_tokens.inc(num_prompt_tokens)
        if num_generated_tokens:
            self.generation_tokens.inc(num_generated_tokens)

    def on_admitted(self, queue_time: float) -> None:
        self.queue_time.observe(queue_time)

    def on_first_token(self, ttft: float) -> None:
        self.ttft.observe(ttft)

    def on_token_gaps(self, gaps: list[float]) -> None:
        observe = self.token_gap.observe
        for gap in gaps:
            observe(gap)

    def on_finish(self, reason: FinishReason, e2e: float) -> None:
        self.e2e.observe(e2e)
        counter = self.finished.get(reason)
        if counter is not None:
            counter.inc()

    def on_grammar_masks(self, seconds: float) -> None:
        self.grammar_masks.observe(seconds)

    def on_grammar_compiled(self, seconds: float) -> None:
        self.grammar_compile.observe(seconds)

    def on_kv_events(self, events: list[KvEvent]) -> None:
        if self.kv_events is not None:
            self.kv_events(events)
