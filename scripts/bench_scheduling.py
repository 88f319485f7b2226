"""Scheduling under a flood, measured (`python -m scripts.bench_scheduling`): the time to first
token of short requests while long generations hold every slot, a scheduling feature on against
off, in one run.

- `--feature preemption`: a paid tier's (tier 0) short requests while a free tier (tier 2)
  floods; `--preemption on` against `off`.
- `--feature lanes`: one key's short requests (8 tokens) while its own long ones (256 tokens)
  flood; `--heavy-sequence-tokens 128` (lanes) against one lane, preemption by tier on in both
  (one tier: it never applies).

One surge per pass (the embedded tiny model, `--max-num-seqs 4`), passes alternating on/off,
each round in the other order. In a pass, `--flood` clients stream 256-token completions back to
back (their prompts vary: no prefix or dedup hit); once they fill the batch, a probe client sends
a short chat request every `--interval` seconds (each its own prompt) and times its first content
token. Reported per mode: the probes' TTFT p50/p90/p99 and the flood's tokens/s over the same
window (what the feature costs the flood), and the ratios on/off.

    .venv/bin/python -m scripts.bench_scheduling --feature preemption     # 2 rounds of 20 s per mode
    .venv/bin/python -m scripts.bench_scheduling --feature lanes --out bench-results/lanes.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from scripts.bench import ensure_model, machine_info
from scripts.harness.servers import start_surge

PAID, FREE = "sk-paid", "sk-free"
KEYS = {PAID: {"tier": 0}, FREE: {"tier": 2}}
WORDS = ["harbour", "tide", "mooring", "sail", "anchor", "rope", "gull", "pier", "beacon", "current", "keel", "rudder"]


def text(words: int) -> str:
    tag = uuid.uuid4().hex[:8]
    return f"[{tag}] " + " ".join(WORDS[(i * 7 + len(tag)) % len(WORDS)] for i in range(words))


async def flood(client: httpx.AsyncClient, url: str, stop: asyncio.Event, tokens: list[float], key: str) -> None:
    body = {"model": "tiny", "max_tokens": 256, "ignore_eos": True, "stream": True}
    while not stop.is_set():
        body["prompt"] = text(40)
        async with client.stream("POST", f"{url}/v1/completions", json=body, headers=auth(key)) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    tokens.append(time.monotonic())
                if stop.is_set():
                    break


async def paid_ttft(client: httpx.AsyncClient, url: str) -> float:
    body = {"model": "tiny", "messages": [{"role": "user", "content": text(12)}], "max_tokens": 8, "stream": True}
    start = time.monotonic()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=auth(PAID)) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for line in reply.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line.replace(" ", ""):
                return time.monotonic() - start
    raise RuntimeError("the paid request's stream had no content")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def one_pass(
    url: str, flood_key: str, num_flood: int, seconds: float, interval: float
) -> tuple[list[float], float]:
    stop = asyncio.Event()
    tokens: list[float] = []
    limits = httpx.Limits(max_connections=num_flood + 64)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        flooding = [asyncio.create_task(flood(client, url, stop, tokens, flood_key)) for _ in range(num_flood)]
        await asyncio.sleep(2.0)  # the flood holds every slot
        started = time.monotonic()
        probes = []
        while time.monotonic() - started < seconds:
            probes.append(asyncio.create_task(paid_ttft(client, url)))
            await asyncio.sleep(interval)
        ttfts = list(await asyncio.gather(*probes))
        ended = time.monotonic()
        stop.set()
        await asyncio.gather(*flooding, return_exceptions=True)
    flood_rate = sum(1 for at in tokens if started <= at <= ended) / (ended - started)
    return ttfts, flood_rate


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--feature", choices=("preemption", "lanes"), default="preemption")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0, help="tier 0's probing per pass")
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--flood", type=int, default=8, help="tier-2 streams at once")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--size", default="m")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix=f"bench-{args.feature}-"))
    model = ensure_model(args.size, Path.home() / ".cache" / "surge" / "bench-models")
    keys = work / "keys.json"
    keys.write_text(json.dumps(KEYS))
    results: dict[str, tuple[list[float], list[float]]] = {"on": ([], []), "off": ([], [])}
    for round_index in range(args.rounds):
        for mode in ("on", "off") if round_index % 2 == 0 else ("off", "on"):
            server_args = ["--keys-file", str(keys), "--max-num-seqs", str(args.max_num_seqs)]
            if args.feature == "preemption":
                server_args += ["--preemption", mode]
            else:
                server_args += ["--heavy-sequence-tokens", "128" if mode == "on" else "0"]
            server_args += ["--max-model-len", "1024", "--degrade-thresholds", "off", "--dedup-ttl-seconds", "0"]
            server_args += ["--served-model-name", "tiny", "--max-concurrent-per-key", "0"]
            server = start_surge(model, work / f"surge-{mode}-{round_index}.log", *server_args)
            try:
                server.wait_ready()
                flood_key = FREE if args.feature == "preemption" else PAID
                ttfts, rate = asyncio.run(one_pass(server.url, flood_key, args.flood, args.seconds, args.interval))
            finally:
                server.stop()
            results[mode][0].extend(ttfts)
            results[mode][1].append(rate)
            p50 = statistics.median(ttfts) * 1000
            print(f"round {round_index + 1} {args.feature} {mode}: {len(ttfts)} probes, TTFT p50 {p50:.0f} ms")
    who = "tier 0's short requests while tier 2" if args.feature == "preemption" else "short requests while long ones"
    lines = [
        f"{args.feature}: the TTFT of {who} flood ({args.flood} streams of 256 tokens,"
        f" --max-num-seqs {args.max_num_seqs}, tiny {args.size}); {args.rounds} rounds of {args.seconds:g} s per mode.",
        f"Machine: {machine_info()}",
        "",
        f"| {args.feature} | probes | short TTFT p50 (ms) | p90 (ms) | p99 (ms) | flood tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    summary = {}
    for mode, (ttfts, rates) in results.items():
        p50, p90, p99 = (percentile(ttfts, q) * 1000 for q in (0.5, 0.9, 0.99))
        summary[mode] = (p50, p99, statistics.mean(rates))
        lines.append(f"| {mode} | {len(ttfts)} | {p50:.0f} | {p90:.0f} | {p99:.0f} | {statistics.mean(rates):.0f} |")
    on, off = summary["on"], summary["off"]
    lines += [
        "",
        f"on/off: TTFT p50 {on[0] / off[0]:.2f}x, p99 {on[1] / off[1]:.2f}x, flood tokens/s {on[2] / off[2]:.2f}x",
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
