"""A fleet's routing, measured (`python -m scripts.bench_fleet`, `make bench-fleet`): two surge
replicas behind `vllm-router`, the multi-turn workload of scripts/benchkit/prefix.py (conversations
side by side, each turn resending its history after a shared-length system prompt) sent through
the router under each policy in turn, on the same replicas in the same run, every round in a new
order: later turns' TTFT p50 and the share of their prompt tokens the replicas served from their
prefix caches, round-robin against the prefix-aware policies.

Each policy's pass sends conversations no other pass sent (their own tags), so no pass finds what
another cached. The replicas publish their KV events (`--kv-events-format array-map`, what this
router version decodes) for `kv_aware`; `cache_aware` keeps its own prefix tree of routed text.

    .venv/bin/python -m scripts.bench_fleet                    # m, 16 conversations x 4 turns, 2 rounds
    .venv/bin/python -m scripts.bench_fleet --rounds 3 --out bench-results/fleet.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from scripts.bench import ensure_model, machine_info
from scripts.benchkit import prefix
from scripts.benchkit.load import RunningServer
from scripts.benchkit.prefix import WorkloadSpec, summarize
from scripts.benchkit.turns import TurnResult
from scripts.harness.ports import free_port
from scripts.harness.servers import ServerProcess, start_surge

POLICIES = ("round_robin", "cache_aware", "kv_aware")
MODEL = "tiny"


def router_binary() -> str:
    beside = Path(sys.executable).parent / "vllm-router"
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if found is None:
        raise SystemExit("vllm-router is not installed: pip install vllm-router (the dev extra has it)")
    return found


def start_router(policy: str, replicas: list[ServerProcess], events: list[str], log_dir: Path) -> ServerProcess:
    argv = [router_binary(), "--host", "127.0.0.1", "--port", "{port}", "--policy", policy, "--worker-urls"]
    argv += [replica.url for replica in replicas]
    argv += ["--prometheus-port", str(free_port()), "--log-level", "warning"]
    if policy == "kv_aware":
        argv += ["--kv-event-model", MODEL, "--kv-event-block-size", "16"]
        for replica, address in zip(replicas, events, strict=True):
            argv += ["--kv-event-source", f"{replica.url}={address}"]
    router = ServerProcess(f"router-{policy}", argv, log_dir / f"router-{policy}.log", ready_path="/health")
    router.start()
    return router


def later_share(results: list[TurnResult]) -> float | None:
    return prefix.hit_rate([r for r in results if r.turn > 1 and r.error is None])


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    model_dir = args.model_dir.resolve() if args.model_dir else ensure_model(args.model_size, args.cache_dir)
    log_dir = args.out.with_suffix("")
    log_dir.mkdir(parents=True, exist_ok=True)
    system_prompt = prefix.fit_text(prefix.token_counter(model_dir), args.prefix_tokens, random.Random(0))
    spec = WorkloadSpec("multi-turn", args.conversations, 1, args.max_tokens, system_prompt, num_turns=args.turns)
    ports = [free_port() for _ in range(args.replicas)]
    common = ["--served-model-name", MODEL, "--max-model-len", str(args.max_model_len), "--degrade-thresholds", "off"]
    common += ["--kv-events-format", "array-map", "--dedup-ttl-seconds", "0"]
    replicas = [
        start_surge(model_dir, log_dir / f"surge-{i}.log", *common, "--kv-events-endpoint", f"tcp://*:{port}")
        for i, port in enumerate(ports)
    ]
    events = [f"tcp://127.0.0.1:{port}" for port in ports]
    rows: list[dict[str, Any]] = []
    try:
        for replica in replicas:
            replica.wait_ready()
        for round_ in range(args.rounds):
            order = POLICIES if round_ % 2 == 0 else POLICIES[::-1]
            for index, policy in enumerate(order):
                router = start_router(policy, replicas, events, log_dir)
                try:
                    sut = RunningServer(policy, router.url, MODEL)
                    timed = replace(spec, seed=1000 * round_ + index + 1)  # conversations no pass sent before
                    results, wall_s, _ = asyncio.run(prefix.run_workload(sut, timed))
                finally:
                    router.stop()
                row = {"policy": policy, "round": round_, "later_hit_share": later_share(results)}
                rows.append(row | summarize(results, wall_s))
                print(json.dumps({k: row[k] for k in ("policy", "round", "later_hit_share")}), flush=True)
    finally:
        for replica in replicas:
            replica.stop(graceful=False)
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"Command: `{' '.join(sys.orig_argv)}`",
        "",
        f"Machine: {machine_info()['cpu']}; {args.replicas} surge replicas of `{args.model_size}` on it, "
        f"{args.conversations} conversations x {args.turns} turns side by side, a {args.prefix_tokens}-token system "
        f"prompt, {args.max_tokens} tokens a reply; {args.rounds} round(s), each policy once a round in turn.",
        "",
        "| policy | round | later turns from cache | TTFT p50 turn 1 ms | TTFT p50 turns 2+ ms | TTFT p99 ms "
        "| tokens/s | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        share = row["later_hit_share"]
        cells = [
            row["policy"],
            str(row["round"]),
            "–" if share is None else f"{100 * share:.1f}%",
            *(
                "–" if row.get(key) is None else f"{1000 * row[key]:.1f}"
                for key in ("ttft_p50_first_s", "ttft_p50_later_s", "ttft_p99_s")
            ),
            f"{row['tokens_per_s']:.1f}",
            str(row["num_errors"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", default="m", choices=("s", "m", "l"))
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=prefix.DEFAULT_PREFIX_TOKENS)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-results/fleet.md"))
    args = parser.parse_args(argv)
    rows = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(rows, args))
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
