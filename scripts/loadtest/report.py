"""The load test's numbers and its markdown: throughput, latency percentiles, errors by status.

Percentiles interpolate linearly between closest ranks (numpy's default). Throughput counts
successful requests and the completion tokens they report, over the wall time of the run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from scripts.harness.stats import percentile
from scripts.loadtest.client import RequestResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class Latency:
    name: str
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    mean_s: float | None
    num_samples: int

    @classmethod
    def of(cls, name: str, values: list[float]) -> Latency:
        p50, p90, p99 = (percentile(values, q) for q in PERCENTILES)
        return cls(name, p50, p90, p99, sum(values) / len(values) if values else None, len(values))


@dataclass(frozen=True, slots=True)
class Summary:
    mode: str
    num_requests: int
    num_ok: int
    num_duplicates: int
    wall_s: float
    requests_per_s: float
    tokens_per_s: float
    completion_tokens: int
    latencies: tuple[Latency, ...]  # TTFT, ITL, e2e
    errors: dict[str, int]  # final error of failed requests, by status or kind
    retried: dict[str, int] = field(default_factory=dict)  # attempts retried, by status or kind

    @property
    def num_errors(self) -> int:
        return self.num_requests - self.num_ok


def summarize(results: list[RequestResult], wall_s: float, mode: str) -> Summary:
    ok = [r for r in results if r.is_ok]
    num_tokens = sum(r.completion_tokens for r in ok)
    latencies = (
        Latency.of("time to first token", [r.ttft_s for r in ok if r.ttft_s is not None]),
        Latency.of("inter-token latency", [gap for r in ok for gap in r.itl_s]),
        Latency.of("end-to-end latency", [r.e2e_s for r in ok if r.e2e_s is not None]),
    )
    return Summary(
        mode=mode,
        num_requests=len(results),
        num_ok=len(ok),
        num_duplicates=sum(r.is_duplicate for r in results),
        wall_s=wall_s,
        requests_per_s=len(ok) / wall_s if wall_s > 0 else 0.0,
        tokens_per_s=num_tokens / wall_s if wall_s > 0 else 0.0,
        completion_tokens=num_tokens,
        latencies=latencies,
        errors=dict(sorted(Counter(r.error for r in results if r.error is not None).items())),
        retried=dict(sorted(Counter(kind for r in results for kind in r.retried).items())),
    )


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f}"


def render_markdown(summary: Summary) -> str:
    lines = [
        "| mode | requests | ok | errors | duplicates | req/s | output tok/s | duration s |",
        "|---|---|---|---|---|---|---|---|",
        f"| {summary.mode} | {summary.num_requests} | {summary.num_ok} | {summary.num_errors} | "
        f"{summary.num_duplicates} | {summary.requests_per_s:.2f} | {summary.tokens_per_s:.1f} | "
        f"{summary.wall_s:.1f} |",
        "",
        "| latency (ms) | p50 | p90 | p99 | mean | samples |",
        "|---|---|---|---|---|---|",
    ]
    for latency in summary.latencies:
        cells = (_ms(latency.p50_s), _ms(latency.p90_s), _ms(latency.p99_s), _ms(latency.mean_s))
        lines.append(f"| {latency.name} | {' | '.join(cells)} | {latency.num_samples} |")
    lines += ["", "| errors by status | requests |", "|---|---|"]
    lines += [f"| {kind} | {count} |" for kind, count in summary.errors.items()] or ["| none | 0 |"]
    if summary.retried:
        retried = ", ".join(f"{kind} x{count}" for kind, count in summary.retried.items())
        lines += ["", f"Retried attempts (same Idempotency-Key): {retried}."]
    return "\n".join(lines) + "\n"
