"""PNG plots of a bench run: tokens/s and TTFT p99 against concurrency, one line per system.

Only closed-loop rows (an integer `concurrency`) without a total failure are plotted. matplotlib is
imported lazily with the Agg backend, so the rest of the bench runs without it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

# (file name, row key, y-axis label, scale): the two plots issue 5 asks for.
PLOTS: tuple[tuple[str, str, str, float], ...] = (
    ("throughput.png", "tokens_per_s", "tokens/s", 1.0),
    ("ttft_p99.png", "ttft_p99_s", "TTFT p99 (ms)", 1000.0),
)

# One colour per system in every plot (matplotlib's cycle would give each plot its own order).
COLORS = {"surge": "C0", "transformers": "C1", "naive": "C2", "ceiling": "C7"}


def is_plottable() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def series(rows: list[dict[str, Any]], key: str) -> dict[str, list[tuple[int, float]]]:
    """{system: [(concurrency, value), ...] sorted by concurrency} for rows that have `key`."""
    points: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        concurrency, value = row.get("concurrency"), row.get(key)
        failed = bool(row.get("num_errors")) and row.get("num_errors") == row.get("num_requests")
        if not isinstance(concurrency, int) or value is None or failed:
            continue
        points[row["system"]].append((concurrency, float(value)))
    return {system: sorted(values) for system, values in points.items()}


def spans_decades(values: list[float]) -> bool:
    """Whether the values spread over more than a factor of 20 (and are all positive): a log axis then."""
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) > 1 and max(positive) / min(positive) > 20


def write_plots(rows: list[dict[str, Any]], out_dir: Path, title: str = "") -> list[Path]:
    """Write PLOTS into `out_dir`; returns the paths written (a plot with no data is skipped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for file_name, key, label, scale in PLOTS:
        data = series(rows, key)
        if not data:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for system, points in sorted(data.items()):
            style = "--" if system == "ceiling" else "-"
            xs, ys = [c for c, _ in points], [v * scale for _, v in points]
            ax.plot(xs, ys, style, marker="o", label=system, color=COLORS.get(system))
        concurrencies = sorted({c for points in data.values() for c, _ in points})
        if len(concurrencies) > 1 and concurrencies[-1] / concurrencies[0] >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        if spans_decades([v for points in data.values() for _, v in points]):
            ax.set_yscale("log")  # else the naive server's seconds flatten everyone else's milliseconds
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(label)
        ax.set_title(f"{label} vs concurrency" + (f" ({title})" if title else ""))
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / file_name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
