"""Long prompts: prefill speed, time to first token, and what a long prompt does to the streams
already decoding; surge against llama.cpp's `llama-server` on the same weights.

    python -m scripts.bench_long --build-llama-server            # m: 2k/8k/16k x 1 and 8 streams, agent, interference
    python -m scripts.bench_long --model-size l --lengths 2048,8192 --streams 1,8
    python -m scripts.bench_long --shape 0.5b --lengths 2048 --streams 1 --workloads prefill

Workloads, each system on a fresh server per workload, the systems alternating round by round
(`--rounds`) so the machine's drift hits them alike:
- `prefill`, L x S: S chat requests of L prompt tokens each (every one its own text: no cache
  helps), sent together, 8 new tokens each. TTFT p50 and max; prefill tokens/s = S x L / the
  last first token's time (the whole burst's prefill).
- `agent`: a Codex-sized turn (the Codex CLI's default request is ~18,600 tokens): a shared
  prefix of `--agent-prefix` tokens (instructions and tools) sent once to warm the caches, then S
  requests of the prefix plus `--agent-tail` unique tokens. TTFT, and the prompt tokens the server
  says it served from cache.
- `interference`: 8 streams decoding (short prompts, up to 4,000 new tokens) when one prompt of
  `--interference-length` tokens arrives. The running streams' inter-token gaps (p50, p99, max)
  in the window from its arrival to its first token, against their gaps before it; its TTFT.
  Chunked prefill should keep them moving (surge: `--max-prompt-chunk-while-decoding`).

Prompts are built to the token with the model's own tokenizer (the `tokenizers` library: no torch
here). Every prefill row also gets its roofline (scripts/benchkit/roofline.py): achieved FLOP/s
as a fraction of this machine's matmul peak for the dtype. Writes `--out` (markdown) and a JSON
beside it. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from scripts import bench
from scripts.benchkit import llama, roofline
from scripts.benchkit.load import WORD_POOL, StatusError, sse_events
from scripts.benchkit.rawhttp import RawHttpClient, RawHttpError
from scripts.harness.servers import surge_argv
from scripts.load_memory import SHAPES, build as build_shape, shape_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("prefill", "agent", "interference")
TIMEOUT_S = 1800.0


class Prompts:
    """Texts of an exact token count, each different from the others (a random tag first)."""

    def __init__(self, model_dir: Path, seed: int = 0) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.rng = random.Random(seed)
        self.words = WORD_POOL.split()

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def text(self, tokens: int) -> str:
        """About `tokens` tokens (within a word's tokens), starting with a random tag."""
        parts = [f"[{self.rng.getrandbits(48):012x}]"]
        while True:
            chunk = " ".join(self.rng.choice(self.words) for _ in range(64))
            parts.append(chunk)
            have = self.count(" ".join(parts))
            if have >= tokens:
                break
        text = " ".join(parts)
        words = text.split(" ")
        low, high = 1, len(words)  # the fewest words that reach `tokens`
        while low < high:
            mid = (low + high) // 2
            if self.count(" ".join(words[:mid])) >= tokens:
                high = mid
            else:
                low = mid + 1
        return " ".join(words[:low])


async def stream(
    client: RawHttpClient, model: str, content: str, max_tokens: int, times: list[float] | None = None
) -> dict[str, Any]:
    """One streamed chat request: the absolute times of its content chunks (into `times` as they
    come, for a caller that cancels it) and its usage."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    start, usage = time.perf_counter(), None
    times = [] if times is None else times
    try:
        async with asyncio.timeout(TIMEOUT_S):
            async for event in sse_events(client, "/v1/chat/completions", body):
                usage = event.get("usage") or usage
                if any((c.get("delta") or {}).get("content") for c in event.get("choices") or ()):
                    times.append(time.perf_counter())
    except (StatusError, RawHttpError, TimeoutError, json.JSONDecodeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "start": start, "times": times}
    return {"error": None if times else "no content", "start": start, "times": times, "usage": usage or {}}


def cached(usage: dict[str, Any]) -> int | None:
    details = usage.get("prompt_tokens_details")
    return (
        int(details["cached_tokens"])
        if isinstance(details, dict) and details.get("cached_tokens") is not None
        else None
    )


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_prefill(client: RawHttpClient, model: str, prompts: list[str]) -> dict[str, Any]:
    sent = time.perf_counter()
    results = await asyncio.gather(*(stream(client, model, p, 8) for p in prompts))
    errors = [r["error"] for r in results if r["error"]]
    if errors:
        return {"errors": len(errors), "error": errors[0]}
    ttfts = [r["times"][0] - r["start"] for r in results]
    prompt_tokens = sum(int(r["usage"].get("prompt_tokens") or 0) for r in results)
    last_first = max(r["times"][0] for r in results) - sent
    hits = [cached(r["usage"]) for r in results]
    return {
        "errors": 0,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_max_s": max(ttfts),
        "prompt_tokens": prompt_tokens,
        "prefill_tokens_per_s": prompt_tokens / last_first,
        "cached_share": (sum(h for h in hits if h) / prompt_tokens) if any(h is not None for h in hits) else None,
    }


def split_gaps(streams: list[list[float]], arrival: float, first: float) -> tuple[list[float], list[float]]:
    """The streams' gaps between chunks ending before `arrival`, and those overlapping the window
    from `arrival` to `first` (the long prompt's first token): what its prefill did to them."""
    before: list[float] = []
    during: list[float] = []
    for times in streams:
        for a, b in itertools.pairwise(times):
            if b <= arrival:
                before.append(b - a)
            elif a < first:
                during.append(b - a)
    return before, during


async def run_interference(client: RawHttpClient, model: str, prompts: Prompts, long_tokens: int) -> dict[str, Any]:
    # Streams long enough to outlast the long prompt's prefill: they are cancelled (their
    # connections closed, as a client that leaves) once it has its first token and a second more.
    chunks: list[list[float]] = [[] for _ in range(8)]
    runners = [asyncio.create_task(stream(client, model, prompts.text(32), 4000, times)) for times in chunks]
    await asyncio.sleep(3.0)  # the 8 are past their prefill and decoding
    arrival = time.perf_counter()
    long = await stream(client, model, prompts.text(long_tokens), 8)
    await asyncio.sleep(1.0)
    ended = [runner.done() for runner in runners]
    for runner in runners:
        runner.cancel()
    await asyncio.gather(*runners, return_exceptions=True)
    if long["error"] or any(ended) or not all(chunks):
        why = long["error"] or "a running stream ended or never started before the long prompt's first token"
        return {"errors": 1, "error": why}
    first = long["times"][0]
    before, during = split_gaps(chunks, arrival, first)
    return {
        "errors": 0,
        "long_ttft_s": first - arrival,
        "itl_before_p50_s": quantile(before, 0.5),
        "itl_during_p50_s": quantile(during, 0.5),
        "itl_during_p99_s": quantile(during, 0.99),
        "itl_during_max_s": max(during) if during else None,
        "gaps_during": len(during),
    }


def servers(args: argparse.Namespace, model_dir: Path, seqs: int, context: int) -> list[bench.BenchServer]:
    """A fresh server per system: `seqs` slots of `context` tokens."""
    out: list[bench.BenchServer] = []
    for system in args.systems:
        if system == "surge":
            argv = surge_argv(model_dir, "--max-num-seqs", str(seqs), "--dtype", args.dtype)
            argv += ["--quantization", args.quantization, *bench._STACK_OFF_ARGS, "--log-level", "warning"]
            argv += ["--shutdown-delay-seconds", "0", *args.surge_arg]
            log_path = args.out.parent / "long-surge.log"
            out.append(bench.BenchServer("surge", argv, str(model_dir), log_path, startup_timeout_s=900.0))
        else:
            argv = [str(args.llama_server), "-m", str(args.gguf), "-np", str(seqs), "-c", str(seqs * context)]
            argv += ["-t", str(args.llama_threads), "-tb", str(args.llama_threads), "--cont-batching"]
            argv += ["--host", "127.0.0.1", "--port", "{port}"]
            log_path = args.out.parent / "long-llama-server.log"
            out.append(bench.BenchServer("llama-server", argv, args.gguf.stem, log_path, ready_path="/health"))
    return out


async def measure(
    server: bench.BenchServer, workload: str, args: argparse.Namespace, prompts: Prompts, case: dict[str, Any]
) -> dict[str, Any]:
    client = RawHttpClient(server.base_url)
    try:
        if workload == "prefill":
            # A first long prompt pays one-off costs (kernels for new shapes, the KV pool's first
            # touch): one of the same length, its own text, before the measured burst.
            await stream(client, server.model_name, prompts.text(case["length"]), 1)
            texts = [prompts.text(case["length"]) for _ in range(case["streams"])]
            return await run_prefill(client, server.model_name, texts)
        if workload == "agent":
            prefix = prompts.text(args.agent_prefix)
            await stream(client, server.model_name, prefix, 1)  # warms the shared prefix
            texts = [prefix + " " + prompts.text(args.agent_tail) for _ in range(case["streams"])]
            return await run_prefill(client, server.model_name, texts)
        await stream(client, server.model_name, prompts.text(args.interference_length), 1)  # the same warm start
        return await run_interference(client, server.model_name, prompts, args.interference_length)
    finally:
        await client.aclose()


def cases(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for workload in args.workloads:
        if workload == "prefill":
            out += [("prefill", {"length": n, "streams": s}) for n in args.lengths for s in args.streams]
        elif workload == "agent":
            out += [("agent", {"length": args.agent_prefix + args.agent_tail, "streams": s}) for s in args.streams]
        else:
            out.append(("interference", {"length": args.interference_length, "streams": 8}))
    return out


def run(args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    prompts = Prompts(model_dir)
    rows: list[dict[str, Any]] = []
    for workload, case in cases(args):
        seqs = max(9, case["streams"] + 1)
        context = case["length"] + 512
        for round_index in range(args.rounds):
            for server in servers(args, model_dir, seqs, context):
                server.start()
                try:
                    result = asyncio.run(measure(server, workload, args, prompts, case))
                finally:
                    server.stop()
                row = {"workload": workload, **case, "round": round_index + 1, "system": server.name, **result}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def render(
    rows: list[dict[str, Any]], args: argparse.Namespace, model_dir: Path, peaks: dict[str, Any], command: str
) -> str:
    costs = roofline.model_costs(model_dir)
    dtype = "int8" if args.quantization == "int8" else args.dtype
    lines = [
        f"Command: `{command}`",
        "",
        f"Model: {model_dir.name}; {args.dtype}, quantization {args.quantization}.",
        "",
    ]
    lines += [*roofline.render_peaks(peaks), ""]
    lines += [
        "| workload | prompt tokens | streams | round | system | TTFT p50 s | TTFT max s | prefill tok/s "
        "| vs llama-server | cached | FLOP/s of peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    peer = {(r["workload"], r["length"], r["streams"], r["round"]): r for r in rows if r["system"] == "llama-server"}
    for r in rows:
        if r["workload"] == "interference" or r.get("errors"):
            continue
        other = peer.get((r["workload"], r["length"], r["streams"], r["round"]))
        ratio = (
            f"{r['prefill_tokens_per_s'] / other['prefill_tokens_per_s']:.2f}x"
            if other and not other.get("errors") and r["system"] != "llama-server"
            else ""
        )
        # Of the matmul peak, for bursts of uncached prompts (an agent turn's cached prefix costs no FLOPs).
        fraction = ""
        if r["workload"] == "prefill":
            achieved = roofline.phase_roofline(costs, peaks, dtype, r["prefill_tokens_per_s"], r["length"] / 2)
            fraction = f"{achieved['flops_of_peak']:.2f}"
        share = "" if r.get("cached_share") is None else f"{r['cached_share']:.0%}"
        lines.append(
            f"| {r['workload']} | {r['length']:,} | {r['streams']} | {r['round']} | {r['system']} "
            f"| {r['ttft_p50_s']:.2f} | {r['ttft_max_s']:.2f} | {r['prefill_tokens_per_s']:,.0f} | {ratio} "
            f"| {share} | {fraction} |"
        )
    interference = [r for r in rows if r["workload"] == "interference" and not r.get("errors")]
    if interference:
        lines += [
            "",
            f"Interference: 8 streams decoding when a {args.interference_length:,}-token prompt arrives (ms).",
            "",
        ]
        lines += [
            "| round | system | its TTFT s | ITL before p50 | ITL during p50 | during p99 | during max | gaps |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in interference:
            ms = {
                k: "" if r[k] is None else f"{r[k] * 1e3:.0f}"
                for k in ("itl_before_p50_s", "itl_during_p50_s", "itl_during_p99_s", "itl_during_max_s")
            }
            lines.append(
                f"| {r['round']} | {r['system']} | {r['long_ttft_s']:.2f} | {ms['itl_before_p50_s']} "
                f"| {ms['itl_during_p50_s']} | {ms['itl_during_p99_s']} | {ms['itl_during_max_s']} "
                f"| {r['gaps_during']} |"
            )
    failed = [r for r in rows if r.get("errors")]
    lines += [""] + [
        f"- failed: {r['workload']} {r['length']} x {r['streams']} {r['system']}: {r['error']}" for r in failed
    ]
    return "\n".join(lines) + "\n"


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, the systems and how each one runs: shared with scripts/cached_turn.py."""
    parser.add_argument("--model-size", choices=("s", "m", "l"), default="m")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a Qwen2.5 shape with random weights instead")
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--systems", default="surge,llama-server")
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--quantization", default="none", choices=("none", "int8"))
    parser.add_argument("--surge-arg", action="append", default=[])
    parser.add_argument("--build-llama-server", action="store_true")
    parser.add_argument("--llama-build", choices=sorted(llama.BUILDS), default="native")
    parser.add_argument("--llama-server", type=Path)
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--llama-threads", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=REPO_ROOT / ".cache" / "bench-models")


def prepare(args: argparse.Namespace) -> Path:
    """The model directory (built when it is a tiny size or a shape), and llama-server's binary and
    GGUF where `--build-llama-server` asks for them; without either, the systems lose llama-server."""
    from models.runner.cpus import available_cpus

    args.llama_threads = args.llama_threads or available_cpus()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.model_dir:
        model_dir: Path = args.model_dir.resolve()
    elif args.shape:
        model_dir = build_shape(args.shape, shape_dir(args.cache_dir, args.shape))
    else:
        model_dir = bench.ensure_model(args.model_size, args.cache_dir)
    if "llama-server" in args.systems:
        if args.build_llama_server:
            llama_dir = args.cache_dir / "llama.cpp"
            args.llama_server = args.llama_server or llama.ensure_llama_server(llama_dir, args.llama_build)
            outtype = llama.gguf_type(args.dtype, args.quantization)
            args.gguf = args.gguf or llama.ensure_gguf(model_dir, llama_dir, outtype)
        elif args.llama_server is None or args.gguf is None:
            print(
                "llama-server: needs --build-llama-server, or --llama-server and --gguf; running surge alone",
                file=sys.stderr,
            )
            args.systems = [s for s in args.systems if s != "llama-server"]
    return model_dir


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--lengths", default="2048,8192,16384")
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--agent-prefix", type=int, default=16384)
    parser.add_argument("--agent-tail", type=int, default=2048)
    parser.add_argument("--interference-length", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench-results" / "long-prompts.md")
    args = parser.parse_args(argv)
    args.lengths = [int(v) for v in args.lengths.split(",")]
    args.streams = [int(v) for v in args.streams.split(",")]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.systems = [s for s in args.systems.split(",") if s]
    if unknown := set(args.workloads) - set(WORKLOADS):
        parser.error(f"unknown workloads {sorted(unknown)}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    model_dir = prepare(args)
    from models.runner.cpus import available_cpus

    peaks = roofline.measure_peaks(available_cpus())
    rows = run(args, model_dir)
    report = render(rows, args, model_dir, peaks, shlex.join(sys.orig_argv))
    args.out.write_text(report)
    args.out.with_suffix(".json").write_text(json.dumps({"peaks": peaks, "rows": rows}, indent=1))
    print(report)
    return 1 if any(r.get("errors") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
