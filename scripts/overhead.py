"""Serving overhead without a model: surge on `--model echo` against a bare Starlette SSE endpoint.

    .venv/bin/python -m scripts.overhead                     # 32 streams x 256 events, 16 rounds
    .venv/bin/python -m scripts.overhead --smoke             # seconds long, for CI and the tests

Two servers, one after the other, each in its own process under the same load:
- `surge`: `surge serve --model echo`, whose forward pass costs nothing, so what is measured is
  surge itself: scheduler, engine loop, sampler, detokenizer, the pipe from the engine process
  to the event loop, chunk JSON, SSE framing and HTTP.
- `bare`: this file run with `--serve-bare`: a Starlette app under uvicorn (same uvicorn, same
  `auto` choice of uvloop and httptools as surge) whose chat endpoint streams, per request, the
  same events surge sends for `max_tokens` tokens (the role chunk, one content chunk per token,
  the finish chunk, `data: [DONE]`), pre-built, from an async generator: the most a Starlette
  SSE endpoint can do on this machine.
The load is C concurrent workers, each streaming `--rounds` chat completions back to back over
one raw `httpx.AsyncClient` (the openai SDK, at about a core of its own, would be the bottleneck),
counting `data:` events. Every request has its own prompt, so surge's dedup never merges them.

NOTE: the load client shares the machine's cores with the server; the table records the client's
and the server's CPU seconds so that can be judged. surge may put several events in one HTTP
write when its stream fell behind; the bare endpoint writes one event per send, as a plain
generator does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from scripts.harness.servers import REPO_ROOT, ServerProcess, surge_argv

MODEL_NAME = "echo"
# The echo model's text (models/runner/echo.py) is a few short tokens; the bare server sends one of
# these per content event so its payloads are the same size.
BARE_TOKENS = (" surge", " echo", " streams", " tokens", ".")


# --- the bare server (run in its own process with --serve-bare) --------------------------------


def bare_app() -> object:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    cache: dict[int, list[bytes]] = {}

    def chunk(delta: str, finish_reason: str | None) -> bytes:
        choice = f'{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{encode(finish_reason)}}}'
        head = '{"id":"chatcmpl-bare","object":"chat.completion.chunk","created":0,"model":"echo","choices":['
        return b"data: " + (head + choice + "]}").encode() + b"\n\n"

    def events_for(num_tokens: int) -> list[bytes]:
        if num_tokens not in cache:
            events = [chunk('{"role":"assistant","content":""}', None)]
            for i in range(num_tokens):
                events.append(chunk(f'{{"content":{encode(BARE_TOKENS[i % len(BARE_TOKENS)])}}}', None))
            events += [chunk("{}", "length"), b"data: [DONE]\n\n"]
            cache[num_tokens] = events
        return cache[num_tokens]

    async def stream(events: list[bytes]) -> AsyncIterator[bytes]:
        for item in events:
            yield item

    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        events = events_for(int(body.get("max_tokens", 16)))
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(events), media_type="text/event-stream", headers=headers)

    async def ready(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/ready", ready)])


def serve_bare(port: int) -> None:
    import uvicorn

    uvicorn.run(bare_app(), host="127.0.0.1", port=port, log_level="warning")  # type: ignore[arg-type]


# --- servers under test ------------------------------------------------------------------------


def surge_server(args: argparse.Namespace) -> ServerProcess:
    # Per-request access-log lines are work a production deployment would not do (as in bench.py).
    argv = surge_argv("echo", "--max-num-seqs", str(max(args.concurrency, 1)), "--log-level", "warning")
    return ServerProcess("surge", [*argv, *args.surge_arg], args.log_dir / "surge-echo.log", own_session=True)


def bare_server(args: argparse.Namespace) -> ServerProcess:
    argv = [sys.executable, "-m", "scripts.overhead", "--serve-bare", "--port", "{port}"]
    return ServerProcess("bare", argv, args.log_dir / "bare-starlette.log", own_session=True)


# --- the load ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    name: str
    num_events: int
    num_requests: int
    num_errors: int
    seconds: float
    client_cpu_s: float
    server_cpu_s: float

    @property
    def events_per_s(self) -> float:
        return self.num_events / self.seconds if self.seconds > 0 else 0.0


async def stream_one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> int:
    """Stream one chat completion; return the number of `data:` events (incl. [DONE])."""
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    count = 0
    tail = b""
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
        async for data in response.aiter_raw():
            # A marker split across two reads is counted once: the 5 kept bytes cannot hold it whole.
            window = tail + data
            count += window.count(b"data: ")
            tail = window[-5:]
    return count


async def run_load(base_url: str, concurrency: int, rounds: int, max_tokens: int, tag: str) -> tuple[int, int, int]:
    """(events, requests, errors) of `concurrency` workers each streaming `rounds` requests."""
    url = base_url + "/v1/chat/completions"
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:

        async def worker(w: int) -> tuple[int, int, int]:
            events = requests = errors = 0
            for r in range(rounds):
                try:
                    events += await stream_one(client, url, f"{tag} worker {w} round {r}: say something", max_tokens)
                    requests += 1
                except (httpx.HTTPError, RuntimeError) as exc:
                    print(f"  worker {w}: {exc!r}", file=sys.stderr)
                    errors += 1
            return events, requests, errors

        totals = await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return sum(t[0] for t in totals), sum(t[1] for t in totals), sum(t[2] for t in totals)


def measure(server: ServerProcess, args: argparse.Namespace) -> Result:
    server.start()
    try:
        # Warm the connection pool and both servers' code paths before timing.
        asyncio.run(run_load(server.url, args.concurrency, 1, min(args.max_tokens, 16), "warmup"))
        client_cpu = _own_cpu_seconds()
        server_cpu = server.cpu_seconds()
        started = time.perf_counter()
        events, requests, errors = asyncio.run(
            run_load(server.url, args.concurrency, args.rounds, args.max_tokens, "timed")
        )
        seconds = time.perf_counter() - started
        return Result(
            server.name,
            events,
            requests,
            errors,
            seconds,
            _own_cpu_seconds() - client_cpu,
            server.cpu_seconds() - server_cpu,
        )
    finally:
        server.stop()


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def table(results: list[Result], args: argparse.Namespace) -> str:
    lines = [
        f"{args.concurrency} streams x {args.rounds} rounds x {args.max_tokens} tokens "
        f"({args.max_tokens + 3} events per request incl. role, finish and [DONE]); nproc {os.cpu_count()}",
        "",
        "| server | events/s | events | requests | errors | seconds | server CPU s | client CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.events_per_s:.0f} | {r.num_events} | {r.num_requests} | {r.num_errors} "
            f"| {r.seconds:.2f} | {r.server_cpu_s:.1f} | {r.client_cpu_s:.1f} |"
        )
    by_name = {r.name: r for r in results}
    if "surge" in by_name and "bare" in by_name and by_name["bare"].events_per_s > 0:
        ratio = by_name["surge"].events_per_s / by_name["bare"].events_per_s
        lines += ["", f"surge / bare: {ratio:.2f} (target >= 0.60)"]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent streaming requests")
    parser.add_argument("--max-tokens", type=int, default=256, help="content events per request")
    parser.add_argument("--rounds", type=int, default=16, help="requests each worker streams back to back")
    parser.add_argument("--servers", default="surge,bare", help="comma-separated: surge, bare")
    parser.add_argument("--surge-arg", action="append", default=[], help="extra `surge serve` argument (repeatable)")
    parser.add_argument("--log-dir", type=Path, default=REPO_ROOT / "bench-results", help="server logs go here")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument("--smoke", action="store_true", help="a seconds-long run: 4 streams x 16 tokens x 1 round")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.concurrency, args.max_tokens, args.rounds = 4, 16, 1
    if args.concurrency < 1 or args.max_tokens < 1 or args.rounds < 1:
        parser.error("--concurrency, --max-tokens and --rounds must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.serve_bare:
        serve_bare(args.port)
        return 0
    makers = {"surge": surge_server, "bare": bare_server}
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    unknown = [n for n in names if n not in makers]
    if unknown:
        print(f"unknown server(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    results = []
    for name in names:
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        results.append(measure(makers[name](args), args))
    report = table(results, args)
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report + "\n")
    return 1 if any(r.num_errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
