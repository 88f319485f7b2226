"""The prefix workloads' driver (`python -m scripts.bench --workload ...`): each workload and round,
every system on a fresh server, one after another so nothing overlaps; a progress bar; the report
files. How a system is started is bench.py's business: it hands over a factory."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scripts.benchkit import prefix, prefix_report
from scripts.benchkit.load import SystemUnderTest
from scripts.benchkit.prefix import NUM_TURNS, TurnResult, WorkloadSpec, combine_rounds, measure
from scripts.benchkit.report import format_cell

Measured = list[tuple[dict[str, Any], list[TurnResult]]]


def workload_list(text: str) -> list[str]:
    try:
        return prefix.parse_workloads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ", ".join(f"{workload} {num}" for workload, num in prefix.DEFAULT_CONCURRENCY.items())
    parser.add_argument(
        "--workload",
        type=workload_list,
        default=[],
        help=f"`default` (the loads above), or comma-separated among {', '.join(prefix.WORKLOADS)} "
        f"(scripts/benchkit/prefix.py; concurrency {defaults} unless --concurrency says)",
    )
    parser.add_argument(
        "--prefix-tokens", type=int, default=prefix.DEFAULT_PREFIX_TOKENS, help="tokens of --workload's system prompt"
    )
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="--workload: start every system once and keep it up; --rounds are then passes taken in turn "
        "on the same servers (less noise between two systems than fresh servers one after another)",
    )


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with a `--workload` run's arguments (None: nothing, or no workload)."""
    if not args.workload:
        return "--side-by-side needs --workload" if args.side_by_side else None
    if args.stack is not None or args.structured or args.rate is not None:
        return "--workload runs alone: not with --stack, --structured or --rate"
    if args.concurrency_given and len(args.concurrency) != 1:
        return "--workload takes one --concurrency"
    return "--prefix-tokens must be positive" if args.prefix_tokens < 1 else None


def main(
    model_dir: Path,
    args: argparse.Namespace,
    command: str,
    machine: dict[str, Any],
    servers: Callable[[WorkloadSpec], list[SystemUnderTest]],
) -> int:
    """Every workload of `args.workload` on every server `servers(spec)` makes; the report; the exit status."""
    system_prompt = prefix.fit_text(prefix.token_counter(model_dir), args.prefix_tokens, random.Random(0))
    specs = [
        WorkloadSpec(
            workload,
            args.concurrency[0] if args.concurrency_given else prefix.DEFAULT_CONCURRENCY[workload],
            args.requests_per_client,
            args.max_tokens,
            system_prompt,
        )
        for workload in args.workload
    ]
    measured = run(specs, args.rounds, servers, progress=not args.no_progress, side_by_side=args.side_by_side)
    extra = {"model_dir": str(model_dir), "system_prompt": system_prompt}
    rows = write(args.out, measured, machine, command, note(model_dir.name, specs, args), extra)
    return 1 if any(row["num_errors"] for row in rows) else 0


def run(
    specs: list[WorkloadSpec],
    rounds: int,
    servers: Callable[[WorkloadSpec], list[SystemUnderTest]],
    progress: bool = True,
    side_by_side: bool = False,
) -> Measured:
    """Every (workload, round), every server of `servers(spec)` in turn (reversed in odd rounds);
    rows carry their round. `side_by_side`: a workload's servers started once, the rounds passes
    on them (prefix.measure_side_by_side)."""
    plan = [(spec, round_, servers(spec)) for spec in specs for round_ in range(1 if side_by_side else rounds)]
    total = sum(spec.num_requests * len(suts) for spec, _, suts in plan) * (rounds if side_by_side else 1)
    bar = tqdm(total=total, unit="req", file=sys.stderr, disable=not progress)
    measured: Measured = []
    with bar:
        for spec, round_, suts in plan:
            if side_by_side:
                bar.set_description(f"{spec.workload} side by side")
                pairs = prefix.measure_side_by_side(suts, spec, rounds, on_done=lambda: bar.update(1))
                for row, _ in pairs:
                    report_row(bar, spec, row)
                measured += pairs
                continue
            # Every other round in reverse order: on a VM that drifts from minute to minute, no
            # system always gets a round's first minutes (the verdicts are ratios of medians).
            for sut in suts if round_ % 2 == 0 else suts[::-1]:
                bar.set_description(f"{spec.workload} {sut.name}")
                done_before = bar.n
                row, results = measure(sut, spec, on_done=lambda: bar.update(1))
                bar.update(max(0, done_before + spec.num_requests - bar.n))  # a failed start, skipped turns
                measured.append((row | {"round": round_}, results))
                report_row(bar, spec, row)
    return measured


def report_row(bar: tqdm, spec: WorkloadSpec, row: dict[str, Any]) -> None:
    """One line per measured row, above the progress bar; its errors on stderr."""
    bar.write(
        f"{spec.workload} {row['system']} c={spec.concurrency}: {row['tokens_per_s']:.1f} tok/s, TTFT p50 "
        f"{format_cell(row['ttft_p50_s'], 1000)} ms, cache hit {format_cell(row['cache_hit_rate'], 100)}"
        f"%, {row['num_errors']} errors",
        file=sys.stdout,
    )
    for error in row["errors"]:
        bar.write(f"  error: {error}", file=sys.stderr)


def note(model_name: str, specs: list[WorkloadSpec], args: argparse.Namespace) -> str:
    """The report's paragraph on what ran (bench.py's arguments)."""
    streams = ", ".join(f"{spec.workload} {spec.concurrency}" for spec in specs)
    return (
        f"Model `{model_name}`; a {args.prefix_tokens}-token system prompt (by its tokenizer); {args.max_tokens} new "
        f"tokens per request, greedy, ignore_eos where the server takes it; streams (conversations for "
        f"multi-turn and responses-chain): {streams}; {args.requests_per_client} request(s) per stream, "
        f"{NUM_TURNS} turns per conversation, closed loop, stream i starting {specs[0].stagger_s * 1000:.0f} ms "
        "x i late; both surge with the traffic stack off. "
        f"Torch threads {args.threads} ({args.prefill_threads} for burst prefills). "
        + (
            f"Side by side: each workload's systems started once and kept up, {args.rounds} timed pass(es) each "
            "taken in turn on the same servers, every other pass in reverse order"
            if args.side_by_side
            else f"{args.rounds} round(s), each system on a fresh server, every other round in reverse order"
        )
        + ": tokens/s the median of the rounds, latencies and hit rate over every round's requests. cache hit %: "
        "cached / prompt tokens as the server reports them (`–`: not reported)."
        + "".join(f" {line}." for line in args.skipped)
    )


def write(
    out: Path, measured: Measured, machine: dict[str, Any], command: str, note: str, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    """Write `out` (markdown) and the same name with `.json` (`extra`, rows, targets, every request);
    print the markdown; return the combined rows."""
    rows = combine_rounds(measured)
    table = prefix_report.render(rows, machine, command, note)
    print("\n" + table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    raw = [row | {"requests": [r.as_json() for r in results]} for row, results in measured]
    report = {"command": command, "machine": machine, **extra}
    report |= {"rows": rows, "targets": prefix_report.target_rows(rows), "raw": raw}
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return rows
