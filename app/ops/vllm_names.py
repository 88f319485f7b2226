"""vLLM's metric names beside surge's own: what the routers of a fleet and vLLM's dashboards read.

The Gateway API Inference Extension's endpoint picker (llm-d-router), vLLM's production-stack
router and its Rust `vllm-router` pick a replica by `vllm:num_requests_waiting`,
`vllm:num_requests_running` and `vllm:kv_cache_usage_perc` (production-stack still reads the older
`vllm:gpu_cache_usage_perc`), and size the cache from `vllm:cache_config_info`; dashboards built
for vLLM plot its token counters and latency histograms. Each such series is surge's own, renamed
at scrape time (no second observation on the engine's path): the same values, the label `model`
as vLLM's `model_name`, and `engine="0"` (vLLM's engine index: surge runs one engine per server).

Semantics, where a router reads them:
- waiting: requests not yet running (the engine's queue and those held between admission and
  submission), as surge_requests_waiting; running: sequences in the batch;
- KV usage (0..1): the share of the KV pool the running sequences hold, as vLLM counts used blocks:
  prefix-cache blocks no running sequence holds are free to take, not "used";
- `vllm:cache_config_info`: the pool as blocks of `block_size` tokens (the prefix cache's block),
  `num_gpu_blocks` of them (on the CPU too, under vLLM's name);
- prefix cache queries and hits: prompt tokens looked up and found (their ratio is the hit rate);
- `vllm:request_success_total{finished_reason}`: sequences that ended with `stop` or `length`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

ENGINE_INDEX = "0"

# surge's family -> the vLLM families that carry the same samples.
ALIASES: dict[str, tuple[str, ...]] = {
    "surge_requests_waiting": ("vllm:num_requests_waiting",),
    "surge_requests_running": ("vllm:num_requests_running",),
    "surge_kv_cache_usage_ratio": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "surge_prefix_cache_queried_tokens": ("vllm:prefix_cache_queries",),
    "surge_prefix_cache_hit_tokens": ("vllm:prefix_cache_hits",),
    "surge_prompt_tokens": ("vllm:prompt_tokens",),
    "surge_generation_tokens": ("vllm:generation_tokens",),
    "surge_time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "surge_inter_token_latency_seconds": ("vllm:inter_token_latency_seconds",),
    "surge_e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "surge_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "surge_requests_finished": ("vllm:request_success",),
}
# Labels renamed on the way (vLLM's words), and the finish reasons vLLM counts as a success.
LABELS = {"model": "model_name", "finish_reason": "finished_reason"}
SUCCESS_REASONS = ("stop", "length")


def with_vllm_names(families: Iterable[Metric]) -> Iterator[Metric]:
    """Each family, then its vLLM aliases where it has any."""
    for family in families:
        yield family
        for alias in ALIASES.get(family.name, ()):
            yield renamed(family, alias)


def renamed(family: Metric, alias: str) -> Metric:
    """`family`'s samples under `alias`, with vLLM's label names and its engine index."""
    metric = Metric(alias, family.documentation + " (surge's " + family.name + ", by vLLM's name)", family.type)
    for sample in family.samples:
        if sample.labels.get("finish_reason", SUCCESS_REASONS[0]) not in SUCCESS_REASONS:
            continue
        labels = {LABELS.get(name, name): value for name, value in sample.labels.items()}
        labels["engine"] = ENGINE_INDEX
        name = alias + sample.name[len(family.name) :]  # keeps _total, _bucket, _count, _sum, _created
        metric.samples.append(Sample(name, labels, sample.value, sample.timestamp, sample.exemplar))
    return metric


def cache_config_info(model: str, block_size: int, num_blocks: int, prefix_caching: bool, dtype: str) -> Metric:
    """vLLM's info gauge (always 1): the routers read the pool's size in blocks from its labels."""
    labels = ["model_name", "engine", "block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype"]
    info = GaugeMetricFamily(
        "vllm:cache_config_info", "The KV cache's configuration (vLLM's CacheConfig).", labels=labels
    )
    values = [model, ENGINE_INDEX, str(block_size), str(num_blocks), str(prefix_caching), dtype]
    info.add_metric(values, 1.0)
    return info


class VllmNamed(Collector):
    """Other collectors' families (their own, then vLLM's names for them): the engine's histograms and
    counters, which the registry then reaches only through this."""

    def __init__(self, sources: Iterable[Collector]) -> None:
        self._sources = list(sources)

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            yield from with_vllm_names(source.collect())
