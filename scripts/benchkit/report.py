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


# The rounds section: each measurement of a `--rounds` run, and the ratios the targets are stated in.
# fmt: off
ROUND_COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("concurrency", "concurrency", None), ("round", "round", None), ("ceiling tok/s", "ceiling", 1),
    ("surge tok/s", "surge", 1), ("transformers tok/s", "transformers", 1), ("llama-server tok/s", "llama", 1),
    ("surge vs ceiling", "surge_vs_ceiling", None), ("surge vs transformers", "surge_vs_peer", None),
    ("TTFT p99 surge / transformers", "ttft_p99_vs_peer", None), ("surge vs llama-server", "surge_vs_llama", None),
)
# fmt: on


def round_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (concurrency, round): tokens/s of the ceiling, surge, `transformers serve` and llama-server,
    and surge's ratios to the others within that round."""
    by_round: dict[tuple[Any, Any], dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row.get("round") is None or row.get("stack") is not None or row["load"] not in ("batch", "closed"):
            continue
        by_round.setdefault((row["concurrency"], row["round"]), {})[row["system"]] = row
    out = []
    for (concurrency, round_), systems in sorted(by_round.items()):
        line: dict[str, Any] = {"concurrency": concurrency, "round": round_ + 1}
        for name in ("ceiling", "surge", "transformers"):
            line[name] = systems[name]["tokens_per_s"] if name in systems else None
        line["llama"] = systems["llama-server"]["tokens_per_s"] if "llama-server" in systems else None
        if line["surge"] and line["llama"]:
            line["surge_vs_llama"] = line["surge"] / line["llama"]
        if line["surge"] and line["ceiling"]:
            line["surge_vs_ceiling"] = line["surge"] / line["ceiling"]
        if line["surge"] and line["transformers"]:
            line["surge_vs_peer"] = line["surge"] / line["transformers"]
            ours, theirs = systems["surge"].get("ttft_p99_s"), systems["transformers"].get("ttft_p99_s")
            if ours is not None and theirs:
                line["ttft_p99_vs_peer"] = ours / theirs
        out.append(line)
    return out


# Issue 19's targets at each concurrency: (metric, row key, against, at least / at most, bound).
SERVING_TARGETS: tuple[tuple[str, str, str, str, float], ...] = (
    ("tokens/s", "tokens_per_s", "llama-server", "at least", 1.1),
    ("TTFT p99", "ttft_p99_s", "llama-server", "at most", 1.0),
    ("tokens/s", "tokens_per_s", "ceiling", "at least", 0.85),
    ("tokens/s", "tokens_per_s", "transformers", "at least", 2.0),
)


def serving_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of SERVING_TARGETS where the run has surge and the other system at a concurrency
    (closed loops and the ceiling's batch; `--stack` rows left out): both values, the ratio, met.
    Against the ceiling the ratio is surge's `vs_ceiling` (taken within each round) where known."""
    by_key = {
        (row["system"], row["concurrency"]): row
        for row in rows
        if row.get("stack") is None and row.get("load") in ("closed", "batch") and row.get("tokens_per_s")
    }
    out = []
    for concurrency in sorted({c for _, c in by_key}):
        surge = by_key.get(("surge", concurrency))
        for metric, key, other_name, sense, bound in SERVING_TARGETS:
            other = by_key.get((other_name, concurrency))
            if surge is None or other is None or surge.get(key) is None or not other.get(key):
                continue
            ratio = surge[key] / other[key]
            if other_name == "ceiling" and surge.get("vs_ceiling") is not None:
                ratio = surge["vs_ceiling"]
            met = ratio >= bound if sense == "at least" else ratio <= bound
            line = {"concurrency": concurrency, "metric": metric, "versus": other_name, "ratio": ratio, "met": met}
            out.append(
                line
                | {
                    "surge": surge[key],
                    "other": other[key],
                    "scale": 1000 if key.startswith("ttft") else 1,
                    "target": f"{'>=' if sense == 'at least' else '<='} {bound:.2f}x",
                }
            )
    return out


def render_serving_targets(lines: list[dict[str, Any]]) -> list[str]:
    out = [
        "| concurrency | metric | surge | against | its value | surge / it | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for line in lines:
        surge, other = (format_cell(line[key], line["scale"]) for key in ("surge", "other"))
        out.append(
            f"| {line['concurrency']} | {line['metric']} | {surge} | {line['versus']} | {other} "
            f"| {line['ratio']:.2f}x | {line['target']} | {'met' if line['met'] else 'not met'} |"
        )
    return out


def preamble(machine: dict[str, Any], command: str, note: str) -> list[str]:
    """The lines above a report's table: the command, the machine, the note."""
    loadavg = " / ".join(f"{x:.2f}" for x in machine["loadavg"])
    return [
        f"Command: `{command}`",
        "",
        f"Machine: {machine['nproc']} CPUs ({machine['cpu']}), torch {machine['torch']}, "
        f"python {machine['python']}, load average at start {loadavg}",
        "",
        note,
        "",
    ]


def render(
    rows: list[dict[str, Any]],
    machine: dict[str, Any],
    command: str,
    note: str,
    round_rows: list[dict[str, Any]] | None = None,
) -> str:
    lines = [*preamble(machine, command, note), *markdown_table(COLUMNS, rows)]
    if round_rows is not None:
        lines += [
            "",
            "### Rounds",
            "",
            "Each round's measurements, one after another; ratios are taken within a round, where the "
            "machine's drift is shared.",
            "",
            *markdown_table(ROUND_COLUMNS, round_ratios(round_rows)),
        ]
    targets = serving_targets(rows)
    if targets:
        lines += [
            "",
            "### Targets (issue 19)",
            "",
            "surge over each other system at the same concurrency, as measured in this run (TTFT in ms); "
            "against the ceiling, the median of each round's ratio.",
            "",
            *render_serving_targets(targets),
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
