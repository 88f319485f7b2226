"""The markdown report: the main table, the "vs stack off" section, and the ratios behind it."""

from __future__ import annotations

from typing import Any

# (title, row key, scale): a scale multiplies the value and prints one decimal (1000: seconds as ms).
# fmt: off
COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("system", "system", None), ("concurrency", "concurrency", None), ("load", "load", None),
    ("requests", "num_requests", None), ("completion tok", "completion_tokens", None),
    ("tokens/s", "tokens_per_s", 1), ("vs ceiling", "vs_ceiling", None), ("req/s", "requests_per_s", 1),
    ("TTFT p50 ms", "ttft_p50_s", 1000), ("TTFT p99 ms", "ttft_p99_s", 1000),
    ("ITL p50 ms", "itl_p50_s", 1000), ("ITL p99 ms", "itl_p99_s", 1000),
    ("e2e p50 ms", "e2e_p50_s", 1000), ("e2e p99 ms", "e2e_p99_s", 1000),
    ("prompt tok", "mean_prompt_tokens", 1), ("errors", "num_errors", None), ("peak RSS MiB", "peak_rss_mib", 1),
)
# fmt: on


# The "vs stack off" section: ratios of each `--stack` mode over `off` at the same concurrency.
# fmt: off
VS_OFF_COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("system", "system", None), ("concurrency", "concurrency", None),
    ("tokens/s", "tokens_per_s", 1), ("tokens/s vs off", "vs_off_tokens_per_s", None),
    ("TTFT p50 ms", "ttft_p50_s", 1000), ("TTFT p50 vs off", "vs_off_ttft_p50", None),
    ("errors", "num_errors", None),
)
# fmt: on


def format_cell(value: Any, scale: int | None) -> str:
    if value is None:
        return "–"
    if scale is not None:
        return f"{value * scale:.1f}"
    return f"{value:.2f}x" if isinstance(value, float) else str(value)


def markdown_table(columns: tuple[tuple[str, str, int | None], ...], rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    return lines + [
        "| " + " | ".join(format_cell(row.get(key), scale) for _, key, scale in columns) + " |" for row in rows
    ]


def add_vs_off(rows: list[dict[str, Any]]) -> None:
    """Set each stack row's tokens/s and TTFT p50 as ratios over the `off` row at its concurrency."""

    def key(row: dict[str, Any]) -> tuple[Any, Any]:
        return row["concurrency"], row.get("load")

    off = {key(row): row for row in rows if row.get("stack") == "off" and row.get("tokens_per_s")}
    for row in rows:
        base = off.get(key(row))
        if row.get("stack") is None or base is None or row.get("num_errors") == row.get("num_requests"):
            continue
        row["vs_off_tokens_per_s"] = row["tokens_per_s"] / base["tokens_per_s"]
        if row.get("ttft_p50_s") is not None and base.get("ttft_p50_s"):
            row["vs_off_ttft_p50"] = row["ttft_p50_s"] / base["ttft_p50_s"]


def render(rows: list[dict[str, Any]], machine: dict[str, Any], command: str, note: str) -> str:
    loadavg = " / ".join(f"{x:.2f}" for x in machine["loadavg"])
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {machine['nproc']} CPUs ({machine['cpu']}), torch {machine['torch']}, "
        f"python {machine['python']}, load average at start {loadavg}",
        "",
        note,
        "",
        *markdown_table(COLUMNS, rows),
    ]
    stack_rows = [row for row in rows if row.get("stack") is not None]
    if any("vs_off_tokens_per_s" in row for row in stack_rows):
        lines += [
            "",
            "### vs stack off",
            "",
            "Each mode over `off` at the same concurrency: tokens/s below 1.00x and TTFT above 1.00x are the "
            "traffic stack's cost. Modes ran one after another, each on a fresh server; single runs.",
            "",
            *markdown_table(VS_OFF_COLUMNS, stack_rows),
        ]
    return "\n".join(lines) + "\n"
