"""Embeddings under concurrency, measured (`python -m scripts.bench_embeddings`): what the encoder's
batching loop gives when many small requests arrive at once.

One `surge serve` (the embedded tiny chat model and its default encoder, `tiny-embedding`, in its
own process). For each concurrency in `--concurrency`, that many clients send single-text
requests back to back for `--seconds` (every text its own: no cache of any kind applies);
reported per level: requests/s, latency p50/p99, and the encoder's mean batch over the window
(from `surge_embedding_batched_inputs_total` / `surge_embedding_batches_total`). At concurrency 1
every request is a forward pass of its own: the others' ratio to it is what batching buys.

    .venv/bin/python -m scripts.bench_embeddings                      # 1, 8, 32 clients, 10 s each
    .venv/bin/python -m scripts.bench_embeddings --out bench-results/embeddings.md
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from scripts.bench import machine_info
from scripts.harness.servers import surge_server

WORDS = ["harbour", "tide", "mooring", "sail", "anchor", "rope", "gull", "pier", "beacon", "current", "keel", "rudder"]


def text() -> str:
    tag = uuid.uuid4().hex
    return f"{tag[:8]} " + " ".join(WORDS[int(c, 16) % len(WORDS)] for c in tag[:24])


def counter(metrics: str, name: str) -> float:
    match = re.search(rf"^{name}{{[^}}]*}} ([0-9.e+-]+)$", metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def level(url: str, clients: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=clients)) as client:
        before = (await client.get(f"{url}/metrics")).text
        deadline = time.monotonic() + seconds

        async def one_client() -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                body = {"model": "tiny-embedding", "input": text(), "encoding_format": "base64"}
                reply = await client.post(f"{url}/v1/embeddings", json=body)
                reply.raise_for_status()
                latencies.append(time.perf_counter() - started)

        started = time.monotonic()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.monotonic() - started
        after = (await client.get(f"{url}/metrics")).text
    batches = counter(after, "surge_embedding_batches_total") - counter(before, "surge_embedding_batches_total")
    inputs = counter(after, "surge_embedding_batched_inputs_total") - counter(
        before, "surge_embedding_batched_inputs_total"
    )
    ordered = sorted(latencies)
    return {
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "mean_batch": inputs / batches if batches else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8,32", help="clients per level, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="each level's length")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    with (
        tempfile.TemporaryDirectory() as tmp,
        surge_server("tiny", Path(tmp) / "surge.log", "--embedding-model", "tiny") as server,
    ):
        results = {clients: asyncio.run(level(server.url, clients, args.seconds)) for clients in levels}
    base = results[levels[0]]["requests_per_s"]
    lines = [
        f"Embeddings, single-text requests, {args.seconds:.0f} s per level. {machine_info()}",
        "",
        "| clients | requests/s | vs first | latency p50 ms | p99 ms | mean batch |",
        "|---|---|---|---|---|---|",
    ]
    for clients, row in results.items():
        lines.append(
            f"| {clients} | {row['requests_per_s']:.0f} | {row['requests_per_s'] / base:.2f}x | {row['p50_ms']:.1f}"
            f" | {row['p99_ms']:.1f} | {row['mean_batch']:.1f} |"
        )
    report = "\n".join(lines)
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
