"""surge's own counters around a load run, read from `GET /metrics`: dedup hits, replays, 429s.

Best effort: another server (or a surge whose /metrics is unreachable) simply has no counters.
"""

from __future__ import annotations

import httpx

# (metric family in the Prometheus text, what the report calls it)
COUNTERS = (
    ("surge_dedup_hits_total", "dedup hits"),
    ("surge_dedup_misses_total", "dedup misses"),
    ("surge_idempotent_replays_total", "idempotent replays"),
    ("surge_rate_limited_requests_total", "rate-limited (429)"),
    ("surge_shed_requests_total", "shed (503)"),
)


def parse_counters(text: str) -> dict[str, float]:
    """Each family of COUNTERS summed over its label sets."""
    totals = dict.fromkeys((name for name, _ in COUNTERS), 0.0)
    for line in text.splitlines():
        name = line.partition("{")[0] if "{" in line else line.partition(" ")[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


async def read_counters(client: httpx.AsyncClient, base_url: str) -> dict[str, float] | None:
    """`base_url` is the API root (…/v1); /metrics sits beside it. None when it cannot be read."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        response = await client.get(url, timeout=5.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200 or "surge_" not in response.text:
        return None
    return parse_counters(response.text)


def render_deltas(before: dict[str, float], after: dict[str, float]) -> str:
    parts = [f"{label} {after[name] - before[name]:.0f}" for name, label in COUNTERS]
    return "Server counters during the run: " + ", ".join(parts) + "."
