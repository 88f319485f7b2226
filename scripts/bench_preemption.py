"""Preemption by tier, measured (`python -m scripts.bench_preemption`): the time to first token of a
paid tier's (tier 0) short requests while a free tier (tier 2) floods the server with long
generations that hold every slot, `--preemption on` against `off`, in one run.

One surge per pass (the embedded tiny model, a keys file of the two tiers, `--max-num-seqs 4`),
passes alternating on/off, each round in the other order. In a pass, `--flood` tier-2 clients
stream 256-token completions back to back (their prompts vary: no prefix or dedup hit); once they
fill the batch, a tier-0 client sends a short chat request every `--interval` seconds (each its own
prompt) and times its first content token. Reported per mode: tier 0's TTFT p50/p90/p99 and the
flood's tokens/s over the same window (what preemption costs the preempted tier), and the ratios
on/off.

    .venv/bin/python -m scripts.bench_preemption                 # 2 rounds of 20 s per mode
    .venv/bin/python -m scripts.bench_preemption --rounds 3 --out bench-results/preemption.md
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


async def flood(client: httpx.AsyncClient, url: str, stop: asyncio.Event, tokens: list[float]) -> None:
    body = {"model": "tiny", "max_tokens": 256, "ignore_eos": True, "stream": True}
    while not stop.is_set():
        body["prompt"] = text(40)
        async with client.stream("POST", f"{url}/v1/completions", json=body, headers=auth(FREE)) as reply:
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


async def one_pass(url: str, num_flood: int, seconds: float, interval: float) -> tuple[list[float], float]:
    stop = asyncio.Event()
    tokens: list[float] = []
    limits = httpx.Limits(max_connections=num_flood + 64)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        flooding = [asyncio.create_task(flood(client, url, stop, tokens)) for _ in range(num_flood)]
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
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0, help="tier 0's probing per pass")
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--flood", type=int, default=8, help="tier-2 streams at once")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--size", default="m")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-preemption-"))
    model = ensure_model(args.size, Path.home() / ".cache" / "surge" / "bench-models")
    keys = work / "keys.json"
    keys.write_text(json.dumps(KEYS))
    results: dict[str, tuple[list[float], list[float]]] = {"on": ([], []), "off": ([], [])}
    for round_index in range(args.rounds):
        for mode in ("on", "off") if round_index % 2 == 0 else ("off", "on"):
            server_args = ["--keys-file", str(keys), "--preemption", mode, "--max-num-seqs", str(args.max_num_seqs)]
            server_args += ["--max-model-len", "1024", "--degrade-thresholds", "off", "--dedup-ttl-seconds", "0"]
            server_args += ["--served-model-name", "tiny", "--max-concurrent-per-key", "0"]
            server = start_surge(model, work / f"surge-{mode}-{round_index}.log", *server_args)
            try:
                server.wait_ready()
                ttfts, rate = asyncio.run(one_pass(server.url, args.flood, args.seconds, args.interval))
            finally:
                server.stop()
            results[mode][0].extend(ttfts)
            results[mode][1].append(rate)
            p50 = statistics.median(ttfts) * 1000
            print(f"round {round_index + 1} preemption {mode}: {len(ttfts)} probes, TTFT p50 {p50:.0f} ms")
    lines = [
        f"Preemption by tier: tier 0's TTFT while tier 2 floods ({args.flood} streams of 256 tokens,"
        f" --max-num-seqs {args.max_num_seqs}, tiny {args.size}); {args.rounds} rounds of {args.seconds:g} s per mode.",
        f"Machine: {machine_info()}",
        "",
        "| preemption | probes | tier-0 TTFT p50 (ms) | p90 (ms) | p99 (ms) | tier-2 tokens/s |",
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
        f"on/off: TTFT p50 {on[0] / off[0]:.2f}x, p99 {on[1] / off[1]:.2f}x, tier-2 tokens/s {on[2] / off[2]:.2f}x",
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
