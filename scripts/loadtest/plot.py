"""The PNG of a load run: each request's latency against the time it started.

One point per request: end-to-end latency, time to first token (streams), and failed requests
as crosses at the bottom edge. A queue building up shows as latency climbing over time.
matplotlib (the `bench` extra) is imported lazily with the Agg backend, so the load tester runs
without it and only the plot is skipped.
"""

from __future__ import annotations

from pathlib import Path

from scripts.loadtest.client import RequestResult


def is_plottable() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_latency_plot(results: list[RequestResult], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.is_ok and r.e2e_s is not None]
    failed = [r for r in results if not r.is_ok]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.scatter([r.start_s for r in ok], [(r.e2e_s or 0) * 1000 for r in ok], s=8, label="end-to-end")
    with_ttft = [r for r in ok if r.ttft_s is not None]
    if with_ttft:
        ax.scatter([r.start_s for r in with_ttft], [(r.ttft_s or 0) * 1000 for r in with_ttft], s=8, label="TTFT")
    if failed:
        ax.scatter([r.start_s for r in failed], [0] * len(failed), marker="x", color="red", s=16, label="error")
    ax.set_xlabel("request start (s since the run began)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
