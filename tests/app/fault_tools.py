"""What the fault tests (tests/app/test_faults_*.py) share beyond the harness (scripts/harness/):
/metrics read as numbers, and latency summaries for the printed figures."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from scripts.harness.loopback import loopback
from scripts.harness.stats import percentile


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    text = loopback().get(f"{url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there are none)."""
    return sum(
        value
        for (sample, sample_labels), value in metrics(url).items()
        if sample == name and all((k, v) in sample_labels for k, v in labels.items())
    )


IDLE_GAUGES = ("surge_requests_running", "surge_requests_waiting", "surge_kv_cache_usage_ratio")


def wait_idle(url: str, timeout: float = 15.0) -> None:
    """Until running, waiting and KV use are all 0 on /metrics (fails the test if never)."""
    deadline = time.monotonic() + timeout
    while True:
        levels = {name: metric(url, name) for name in IDLE_GAUGES}
        if not any(levels.values()):
            return
        assert time.monotonic() < deadline, f"not idle after {timeout:.0f} s: {levels}"
        time.sleep(0.05)


def summary_ms(values: Sequence[float]) -> str:
    """p50 / p90 / max in milliseconds, for the printed figures (`pytest -s` shows them)."""
    if not values:
        return "no samples"
    p90 = percentile(values, 90) or 0.0
    return (
        f"n={len(values)} p50={statistics.median(values) * 1000:.1f} ms "
        f"p90={p90 * 1000:.1f} ms max={max(values) * 1000:.1f} ms"
    )
