"""`python -m scripts.loadtest`: flags, the run, and what is printed.

    python -m scripts.loadtest --concurrency 16 --duration 30       # closed loop, 16 users
    python -m scripts.loadtest --rate 8 --duration 30 --no-stream   # open loop, Poisson 8 req/s
    python -m scripts.loadtest --duplicate-fraction 0.5 --retries 3 # dedup hits; idempotent retries

The report (markdown) goes to stdout, and to `--out` when given; the progress line to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import httpx

from scripts.loadtest.client import RetryPolicy
from scripts.loadtest.plot import is_plottable, write_latency_plot
from scripts.loadtest.report import render_markdown, summarize
from scripts.loadtest.runner import LoadConfig, RunResult, run_load
from scripts.loadtest.server_metrics import read_counters, render_deltas
from scripts.loadtest.workload import IntRange, WorkloadSpec

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_PLOT = Path("bench-results/loadtest-latency.png")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.loadtest", description="Load-test an OpenAI-compatible chat completions endpoint."
    )
    target = parser.add_argument_group("target")
    target.add_argument(
        "--base-url", default=os.environ.get("SURGE_BASE_URL", DEFAULT_BASE_URL), help="API root (…/v1)"
    )
    target.add_argument("--api-key", default=os.environ.get("SURGE_API_KEY"), help="Bearer key (SURGE_API_KEY)")
    target.add_argument("--model", default=os.environ.get("SURGE_MODEL_NAME"), help="default: the first in /v1/models")
    shape = parser.add_argument_group("load shape")
    loop = shape.add_mutually_exclusive_group()
    loop.add_argument("--rate", type=float, help="open loop: Poisson arrivals at this many requests/s")
    loop.add_argument("--concurrency", type=int, default=8, help="closed loop: this many users (default 8)")
    shape.add_argument("--duration", type=float, default=30.0, help="seconds during which requests start")
    shape.add_argument("--num-requests", type=int, help="start at most this many requests")
    shape.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True, help="SSE (default) or JSON")
    work = parser.add_argument_group("requests")
    work.add_argument("--prompt-words", type=IntRange.parse, default=IntRange(8, 64), help="N or LOW:HIGH (8:64)")
    work.add_argument("--max-tokens", type=IntRange.parse, default=IntRange(16, 128), help="N or LOW:HIGH (16:128)")
    work.add_argument("--temperature", type=float, default=0.0, help="0 (default) is what dedup can share")
    work.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask for exactly max_tokens (vLLM's field; surge honours it)",
    )
    work.add_argument("--duplicate-fraction", type=float, default=0.0, help="share of exact repeats (0-1)")
    work.add_argument("--retries", type=int, default=0, help="retries of 409/429/503/connection errors, one key")
    work.add_argument("--timeout", type=float, default=120.0, help="seconds per attempt")
    work.add_argument("--seed", type=int, default=0, help="lengths and words; prompts still differ per run")
    output = parser.add_argument_group("output")
    output.add_argument("--out", type=Path, help="also write the markdown report here")
    output.add_argument("--plot", type=Path, default=DEFAULT_PLOT, help=f"latency PNG ({DEFAULT_PLOT})")
    output.add_argument("--no-plot", action="store_true", help="skip the PNG")
    output.add_argument("--quiet", action="store_true", help="no progress line")
    return parser


def config_from_args(args: argparse.Namespace, model: str) -> LoadConfig:
    if args.rate is not None and args.rate <= 0:
        raise ValueError("--rate must be positive")
    if args.concurrency < 1 or args.duration <= 0 or args.retries < 0:
        raise ValueError("--concurrency must be >= 1, --duration > 0 and --retries >= 0")
    return LoadConfig(
        base_url=args.base_url,
        model=model,
        workload=WorkloadSpec(
            args.prompt_words, args.max_tokens, args.duplicate_fraction, args.seed, run_id=uuid.uuid4().hex[:8]
        ),
        rate=args.rate,
        concurrency=args.concurrency,
        duration_s=args.duration,
        max_requests=args.num_requests,
        is_streaming=args.stream,
        temperature=args.temperature,
        extra_body={"ignore_eos": True} if args.ignore_eos else {},
        headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {},
        retry=RetryPolicy(max_retries=args.retries),
        timeout_s=args.timeout,
    )


async def _resolve_model(base_url: str, headers: dict[str, str]) -> str:
    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.get(f"{base_url.rstrip('/')}/models", headers=headers)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])


async def _run(args: argparse.Namespace) -> tuple[LoadConfig, RunResult, str | None]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model or await _resolve_model(args.base_url, headers)
    config = config_from_args(args, model)
    async with httpx.AsyncClient(headers=headers) as client:
        before = await read_counters(client, config.base_url)
        run = await run_load(config, progress_out=None if args.quiet else sys.stderr)
        after = await read_counters(client, config.base_url)
    counters = render_deltas(before, after) if before is not None and after is not None else None
    return config, run, counters


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config, run, counters = asyncio.run(_run(args))
    except ValueError as exc:
        parser.error(str(exc))
    except httpx.HTTPError as exc:
        print(f"loadtest: cannot reach {args.base_url}: {exc}", file=sys.stderr)
        return 2

    summary = summarize(run.results, run.wall_s, config.mode)
    workload = config.workload
    header = [
        f"Command: `python -m scripts.loadtest {shlex.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        f"Target: {config.base_url}, model `{config.model}`; {'streaming' if config.is_streaming else 'JSON'}, "
        f"prompts of {workload.prompt_words} words, max_tokens {workload.max_tokens}, "
        f"temperature {config.temperature:g}, duplicates {workload.duplicate_fraction:.0%}, "
        f"retries {config.retry.max_retries}.",
        "",
    ]
    report = "\n".join(header) + "\n" + render_markdown(summary) + (f"\n{counters}\n" if counters else "")
    print(report, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    if not args.no_plot:
        if is_plottable():
            path = write_latency_plot(run.results, args.plot, f"loadtest: {config.mode}")
            print(f"\nLatency plot: {path}")
        else:
            print("\nmatplotlib is not installed (pip install 'surge[bench]'): skipping the latency plot.")
    return 0 if summary.num_ok else 1
