"""Where a cached chat turn's time to first token goes: surge against llama.cpp's `llama-server`.

    python -m scripts.cached_turn --build-llama-server                  # m, 4 conversations x 5 turns
    python -m scripts.cached_turn --shape 0.5b --build-llama-server --dtype bfloat16
    python -m scripts.cached_turn --systems surge --turns 8

One conversation at a time, one turn at a time (nothing else runs, so nothing queues behind
anything): a shared system prompt of `--prefix-tokens` tokens (every conversation's own tag first,
as the multi-turn workload of scripts/benchkit/prefix.py), each turn the whole history so far plus
a new user message. Later turns find all but the new part in the server's prefix cache. Per turn:
- the client's TTFT (request sent to first streamed text);
- surge: the engine's own figures read off /metrics just before and after the request (the sum of
  `surge_queue_time_seconds` and of `surge_time_to_first_token_seconds`, which counts from the
  engine taking the request to its first token reaching the API process), so that
  `client TTFT = front end + queue + prefill and first token`, where the front end is HTTP, the
  chat template and tokenizer, the hand-off to the engine's process and the way back to the
  socket; the template and tokenizer part is timed here on the same messages with surge's own
  `Tokenizer.encode_chat` (the median of 5);
- llama-server: its `timings` (the prompt tokens it evaluated, the ones it reused, `prompt_ms`),
  so that `client TTFT = prompt_ms + the rest` (its HTTP, template, tokenizer, cache lookup and
  first-token path);
- prompt tokens, and the ones each server says it served from cache.
Reports the median per turn over the conversations, and over every later turn. Not a load test:
scripts/bench.py --workload multi-turn is that; this says what a single cached turn costs where.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shlex
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from scripts import bench, bench_long
from scripts.benchkit.load import sse_events
from scripts.benchkit.prefix import Conversation, conversations, fit_text, token_counter
from scripts.benchkit.rawhttp import RawHttpClient

REPO_ROOT = Path(__file__).resolve().parents[1]
ENGINE_SUMS = {"queue": "surge_queue_time_seconds_sum", "engine_ttft": "surge_time_to_first_token_seconds_sum"}


def engine_sums(base_url: str) -> dict[str, float]:
    """The engine's running sums (every model label added up) from surge's /metrics."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    sums = {}
    for key, name in ENGINE_SUMS.items():
        values = re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, flags=re.MULTILINE)
        if not values:
            raise RuntimeError(f"{name} is not in /metrics")
        sums[key] = sum(float(v) for v in values)
    return sums


async def turn(client: RawHttpClient, model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """One streamed turn: the reply, the client's TTFT, usage's prompt and cached tokens, and
    llama-server's `timings` when it sends them."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body |= {"stream_options": {"include_usage": True}, "ignore_eos": True}
    parts: list[str] = []
    first: float | None = None
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    start = time.perf_counter()
    async for event in sse_events(client, "/v1/chat/completions", body):
        if "error" in event:
            raise RuntimeError(f"stream error: {event['error']}")
        usage = event.get("usage") or usage
        timings = event.get("timings") or timings
        for choice in event.get("choices") or ():
            if content := (choice.get("delta") or {}).get("content"):
                first = first or time.perf_counter()
                parts.append(content)
    if first is None:
        raise RuntimeError("the stream sent no text")
    details = usage.get("prompt_tokens_details") or {}
    row: dict[str, Any] = {"ttft_s": first - start, "prompt_tokens": usage.get("prompt_tokens")}
    row["cached_tokens"] = details.get("cached_tokens", timings.get("cache_n"))
    if timings:
        row["prompt_ms"], row["evaluated"] = timings.get("prompt_ms"), timings.get("prompt_n")
    return row | {"text": "".join(parts)}


def template_seconds(encode: Any, messages: list[dict[str, str]]) -> float:
    """surge's chat template and tokenizer on `messages`, the median of 5 (the first warms caches)."""
    times = []
    for _ in range(6):
        start = time.perf_counter()
        encode(messages)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


async def converse(
    server: bench.BenchServer, talk: Conversation, turns: int, max_tokens: int, encode: Any
) -> list[dict[str, Any]]:
    client = RawHttpClient(server.base_url)
    rows: list[dict[str, Any]] = []
    try:
        for index in range(turns):
            messages = talk.messages(index, [r["text"] for r in rows])
            before = engine_sums(server.base_url) if server.name == "surge" else None
            row = await turn(client, server.model_name, messages, max_tokens)
            row["turn"] = index + 1
            if before is not None:
                after = engine_sums(server.base_url)
                row |= {key: after[key] - before[key] for key in ENGINE_SUMS}
                row["template_s"] = template_seconds(encode, messages)
            rows.append(row)
    finally:
        await client.aclose()
    return rows


def surge_encoder(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    from models.loading.tokenizer import Tokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(model_dir)).encode_chat


def run(args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    system_prompt = fit_text(token_counter(model_dir), args.prefix_tokens, rng)
    # A warm-up conversation of its own, then the measured ones: no two share a tag.
    talks = conversations(system_prompt, args.conversations + 1, args.turns, args.seed)
    encode = surge_encoder(model_dir)
    context = args.prefix_tokens + args.turns * (args.max_tokens + 64) + 512
    rows: list[dict[str, Any]] = []
    for server in bench_long.servers(args, model_dir, 2, context):
        server.start()
        try:
            asyncio.run(converse(server, talks[0], 2, args.max_tokens, encode))
            for number, talk in enumerate(talks[1:], start=1):
                for row in asyncio.run(converse(server, talk, args.turns, args.max_tokens, encode)):
                    row = {"system": server.name, "conversation": number} | row
                    del row["text"]
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            server.stop()
    return rows


def median(rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    return f"{scale * statistics.median(values):,.1f}" if values else ""


def render(rows: list[dict[str, Any]], args: argparse.Namespace, model_dir: Path, command: str) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        f"Model `{model_dir.name}`, {args.dtype}, quantization {args.quantization}; {args.conversations} "
        f"conversations one after another, {args.turns} turns each, a {args.prefix_tokens}-token shared system "
        f"prompt, {args.max_tokens} new tokens a turn. Medians over the conversations, milliseconds.",
        "",
        "| system | turn | prompt tokens | cached | client TTFT | front end | of which template + tokenizer "
        "| queue | prefill + first token | llama-server prompt_ms (evaluated tokens) | rest |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system in args.systems:
        mine = [r for r in rows if r["system"] == system]
        groups = [(str(t), [r for r in mine if r["turn"] == t]) for t in range(1, args.turns + 1)]
        groups.append((f"2-{args.turns}", [r for r in mine if r["turn"] > 1]))
        for label, group in groups:
            if not group:
                continue
            for r in group:
                if "engine_ttft" in r:
                    r["front_s"] = r["ttft_s"] - r["engine_ttft"]
                    r["prefill_s"] = r["engine_ttft"] - r["queue"]
                if r.get("prompt_ms") is not None:
                    r["rest_s"] = r["ttft_s"] - r["prompt_ms"] / 1000
            evaluated = median(group, "evaluated", 1.0)
            prompt_ms = f"{median(group, 'prompt_ms')} ({evaluated})" if evaluated else ""
            cells = [
                system,
                label,
                median(group, "prompt_tokens"),
                median(group, "cached_tokens"),
                median(group, "ttft_s", 1000),
                median(group, "front_s", 1000),
                median(group, "template_s", 1000),
                median(group, "queue", 1000),
                median(group, "prefill_s", 1000),
                prompt_ms,
                median(group, "rest_s", 1000),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_long.add_server_arguments(parser)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--prefix-tokens", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench-results" / "cached-turn.md")
    args = parser.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    if unknown := set(args.systems) - {"surge", "llama-server"}:
        parser.error(f"unknown systems {sorted(unknown)}")
    if args.conversations < 1 or args.turns < 2 or args.prefix_tokens < 1 or args.max_tokens < 1:
        parser.error("--conversations, --prefix-tokens and --max-tokens must be positive, --turns at least 2")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    model_dir = bench_long.prepare(args)
    rows = run(args, model_dir)
    report = render(rows, args, model_dir, shlex.join(sys.orig_argv))
    args.out.write_text(report)
    args.out.with_suffix(".json").write_text(json.dumps({"rows": rows}, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
