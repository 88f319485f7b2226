"""The load test's summary and markdown, and surge's counters parsed from /metrics (pure)."""

from __future__ import annotations

from scripts.loadtest.client import RequestResult
from scripts.loadtest.report import render_markdown, summarize
from scripts.loadtest.server_metrics import parse_counters, render_deltas


def test_summary_counts_ok_tokens_and_errors_by_status() -> None:
    results = [
        RequestResult(0.0, ttft_s=0.1, e2e_s=1.0, itl_s=[0.01, 0.03], completion_tokens=10),
        RequestResult(0.5, is_duplicate=True, ttft_s=0.2, e2e_s=2.0, completion_tokens=20, retried=["429"]),
        RequestResult(1.0, error="429"),
        RequestResult(1.5, error="503"),
        RequestResult(2.0, error="429"),
    ]
    summary = summarize(results, wall_s=2.0, mode="closed loop, 2 users")
    assert (summary.num_requests, summary.num_ok, summary.num_errors, summary.num_duplicates) == (5, 2, 3, 1)
    assert summary.requests_per_s == 1.0 and summary.tokens_per_s == 15.0
    assert summary.errors == {"429": 2, "503": 1} and summary.retried == {"429": 1}
    ttft, itl, e2e = summary.latencies
    assert ttft.p50_s is not None and abs(ttft.p50_s - 0.15) < 1e-9 and itl.num_samples == 2 and e2e.p99_s == 1.99

    text = render_markdown(summary)
    assert "| closed loop, 2 users | 5 | 2 | 3 | 1 | 1.00 | 15.0 | 2.0 |" in text
    assert "| time to first token | 150.0 | 190.0 | 199.0 | 150.0 | 2 |" in text
    assert "| 429 | 2 |" in text and "| 503 | 1 |" in text
    assert "Retried attempts (same Idempotency-Key): 429 x1." in text


def test_counters_sum_label_sets_and_render_as_deltas() -> None:
    text = "\n".join(
        [
            "# HELP surge_dedup_hits_total Requests that joined or replayed a shared generation.",
            'surge_dedup_hits_total{model="tiny"} 3.0',
            'surge_dedup_hits_created{model="tiny"} 1.7e9',
            'surge_rate_limited_requests_total{bucket="requests",model="tiny"} 2.0',
            'surge_rate_limited_requests_total{bucket="tokens",model="tiny"} 1.0',
        ]
    )
    after = parse_counters(text)
    assert after["surge_dedup_hits_total"] == 3.0 and after["surge_rate_limited_requests_total"] == 3.0
    line = render_deltas(parse_counters(""), after)
    assert line.startswith("Server counters during the run: dedup hits 3, dedup misses 0,")
    assert "rate-limited (429) 3" in line
