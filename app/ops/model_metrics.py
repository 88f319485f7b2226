"""The figures each served chat model has of its own, read at scrape time: one sample per model.

Every served model (`--model`, repeated: app/runtime/served.py) has its own engine, queue, K/V,
prefix cache, admission and degradation levels, so each of these families carries one series per
model (`model` label; `surge_model_info` adds `model_version`). Before the models have loaded,
the main model's series read 0. The server-wide families (rate limits, dedup, connections, Redis)
are app/ops/metrics.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from app.runtime.state import ServerState
from middleware.admission.admission import Admission
from middleware.admission.degradation import load_signals
from models import AsyncEngine, PrefixCacheStats

# Engine workers per process: one engine thread per model. Per-worker queue depth is the HPA's metric.
NUM_WORKERS = 1


class Served(NamedTuple):
    name: str
    version: str
    engine: AsyncEngine | None
    admission: Admission | None

    @property
    def num_waiting(self) -> int:
        """The engine's queue plus requests held between admission and submission."""
        held = self.admission.num_held if self.admission is not None else 0
        return held + (self.engine.core.num_waiting if self.engine is not None else 0)

    @property
    def prefix_cache(self) -> PrefixCacheStats:
        return self.engine.core.prefix_cache_stats if self.engine is not None else PrefixCacheStats()


def served_models(state: ServerState) -> list[Served]:
    if state.models:
        return [Served(m.name, m.version, m.engine, m.admission) for m in state.models.values()]
    return [Served(state.settings.model_name, state.settings.version_label, None, None)]


def model_metrics(state: ServerState) -> Iterator[Metric]:
    served = served_models(state)

    def gauge(name: str, doc: str, value: Callable[[Served], float]) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["model"])
        for model in served:
            family.add_metric([model.name], value(model))
        return family

    def counter(name: str, doc: str, value: Callable[[Served], float]) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["model"])
        for model in served:
            family.add_metric([model.name], value(model))
        return family

    def core_of(model: Served, read: Callable[[AsyncEngine], float]) -> float:
        return read(model.engine) if model.engine is not None else 0

    yield gauge(
        "surge_requests_waiting",
        "Requests not yet running: the engine's queue plus those held in the HTTP layer between admission and"
        " submission.",
        lambda m: m.num_waiting,
    )
    yield gauge(
        "surge_requests_running",
        "Sequences in the running batch.",
        lambda m: core_of(m, lambda engine: engine.core.num_running),
    )
    yield gauge(
        "surge_requests_in_queue_per_worker",
        "surge_requests_waiting per engine worker (one per process): the autoscaling metric.",
        lambda m: m.num_waiting / NUM_WORKERS,
    )
    yield gauge(
        "surge_kv_cache_usage_ratio",
        "Tokens held by running sequences over the KV cache's capacity (max_num_seqs x max_model_len);"
        " where surge_kv_cache_max_tokens is set, the tokens they were admitted for over it.",
        lambda m: core_of(m, lambda engine: engine.core.kv_usage),
    )
    info = GaugeMetricFamily(
        "surge_model_info",
        "1, labelled with the served model and its version (--model-version): join it on the pod to compare"
        " a canary's latencies and errors with the stable deployment's.",
        labels=["model", "model_version"],
    )
    for model in served:
        info.add_metric([model.name, model.version], 1.0)
    yield info
    yield gauge(
        "surge_max_num_seqs",
        "Sequences decoded together: --max-num-seqs, or fewer where the K/V's memory budget holds fewer.",
        lambda m: core_of(m, lambda engine: engine.config.scheduler.max_num_seqs),
    )
    yield gauge(
        "surge_kv_cache_max_tokens",
        "Where the K/V's budget counts tokens (the CPU's reserved cache), the tokens running sequences may"
        " be admitted for (prompt plus max_tokens each); 0 when max_num_seqs x max_model_len bound them.",
        lambda m: core_of(m, lambda engine: engine.config.scheduler.max_kv_tokens),
    )
    yield gauge(
        "surge_kv_cache_budget_bytes",
        "The K/V's memory budget, slots and prefix cache together (--kv-cache-memory); 0 when unchecked.",
        lambda m: core_of(m, lambda engine: engine.config.scheduler.kv_cache_bytes),
    )
    # vLLM's `prefix_cache_queries` and `prefix_cache_hits` (tokens): their ratio is the hit rate.
    yield counter(
        "surge_prefix_cache_queried_tokens",
        "Prompt tokens looked up in the prefix cache (all but the last of each admitted prompt).",
        lambda m: m.prefix_cache.queried_tokens,
    )
    yield counter(
        "surge_prefix_cache_hit_tokens",
        "Prompt tokens whose K/V came from the prefix cache.",
        lambda m: m.prefix_cache.hit_tokens,
    )
    yield counter(
        "surge_prefix_cache_evicted_blocks",
        "Prefix-cache blocks evicted, least recently used first, to keep newer ones.",
        lambda m: m.prefix_cache.evicted_blocks,
    )
    yield gauge(
        "surge_prefix_cache_used_bytes", "Bytes of K/V the prefix cache holds.", lambda m: m.prefix_cache.used_bytes
    )
    yield gauge(
        "surge_prefix_cache_pinned_bytes",
        "Bytes of it the warm templates hold (--warm-templates): never evicted, at most half the bound.",
        lambda m: m.prefix_cache.pinned_bytes,
    )
    yield gauge(
        "surge_prefix_cache_capacity_bytes",
        "The prefix cache's bound in bytes (--prefix-cache-size); 0 when it is off.",
        lambda m: m.prefix_cache.capacity_bytes,
    )
    # One series per model and tier (the keys file's, and 0): each has its own level. `max by (pod)`
    # over them is the level of the most degraded one.
    levels = GaugeMetricFamily(
        "surge_degradation_level",
        "Current degradation level of each tier (lower = more important), 0 (normal) to 4 (shedding).",
        labels=["model", "tier"],
    )
    signals = GaugeMetricFamily(
        "surge_degradation_signal_ratio",
        "Each degradation signal over its bound for the whole engine (1 = at it; the load score is the"
        " largest): queue_depth, queue_time, ttft, error_rate, step_time, kv_usage, memory, compute.",
        labels=["model", "signal"],
    )
    shed = CounterMetricFamily(
        "surge_shed_requests",
        "Requests refused with 503 at admission: queue_full (queue bounds) or load (degradation).",
        labels=["model", "reason"],
    )
    for model in served:
        for tier, level in (model.admission.levels.levels() if model.admission is not None else {0: 0}).items():
            levels.add_metric([model.name, str(tier)], level)
        if model.engine is not None:
            for name, ratio in load_signals(model.engine.load_snapshot(), state.settings.degradation).items():
                signals.add_metric([model.name, name], ratio)
        shed.add_metric([model.name, "queue_full"], model.admission.num_queue_full if model.admission else 0)
        shed.add_metric([model.name, "load"], model.admission.num_shed if model.admission else 0)
    yield from (levels, signals, shed)
    yield counter(
        "surge_requests_aborted",
        "Sequences aborted because their client went away.",
        lambda m: core_of(m, lambda engine: engine.core.num_aborted),
    )
    yield counter(
        "surge_requests_preempted",
        "Running sequences sent back to the queue for a more important tier's (--preemption): each resumes"
        " later from its prompt and what it had generated.",
        lambda m: core_of(m, lambda engine: engine.core.num_preempted),
    )
    yield counter(
        "surge_light_model_requests",
        "Requests that asked for this model and were given the light model under load (--light-model).",
        lambda m: state.light_routed[m.name],
    )
