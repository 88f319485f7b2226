"""Serving benchmark: streaming load against each system under test, next to the raw decode ceiling.

    .venv/bin/python -m scripts.bench --model-size m --concurrency 32
    .venv/bin/python -m scripts.bench --smoke --out /tmp/bench.md   # seconds long, for CI
    .venv/bin/python -m scripts.bench --shape 0.5b --systems surge,llama-server --build-llama-server --concurrency 32
    .venv/bin/python -m scripts.bench --stack off,memory,redis        # the traffic stack's cost
    .venv/bin/python -m scripts.bench --stack off,log-batch --rate 8  # the adaptive batch size against continuous
    .venv/bin/python -m scripts.bench --systems surge,naive --rate 4 --duration 20   # plus an open loop
    .venv/bin/python -m scripts.bench --structured --concurrency 32 --rounds 3       # constrained decoding's cost
    .venv/bin/python -m scripts.bench --workload shared-prefix,multi-turn,no-shared  # the prefix cache's worth
    .venv/bin/python -m scripts.bench --workload multi-turn,responses-chain --systems surge  # chat vs Responses chains
    make bench                                                        # the bench extra, then the full run

For each concurrency B (default 1,8,32,64), one measurement after another so nothing overlaps:
- `ceiling`: the model in a fresh subprocess, batch B, 32 random prompt tokens, one prefill and a
  hand-written greedy decode loop over a `DynamicCache`; tokens/s of the best of 2 runs after a warmup.
- each system under test in `--systems` (default: every one installed; surge alone with `--smoke` or
  `--stack`): `surge`; `transformers` (`transformers serve --continuous-batching`, the `bench` extra);
  `naive` (scripts/naive_server.py, one `generate()` at a time). Each is started fresh, warmed up,
  then B closed-loop workers each stream `--requests-per-client` chat completions back to back over
  one pool of keep-alive connections (scripts/benchkit/rawhttp.py). A system that fails to start
  is an error row, not the end of the run.
  With `--stack`, one fresh surge per traffic-stack mode (see `STACK_MODES`), rows `surge[MODE]`,
  and a "vs stack off" section: each mode's tokens/s and TTFT p50 over `off`'s at the same B.
- with `--rate R`, after the closed loops: each system once more under an open loop, Poisson
  arrivals at R requests/s for `--duration` seconds (rows with load `poisson R/s`).
With `--workload` (scripts/benchkit/prefix.py), the prefix-caching workloads instead: `surge` (the
cache on, its default) against `surge[cache-off]`, both with the traffic stack off, plus the peers.
Writes `--out` (markdown), the same name with `.json` (rows and every request), and, when matplotlib
is importable, throughput.png and ttft_p99.png next to it. A progress bar runs on stderr.

tokens/s counts the completion tokens each server reports (its usage), not max_tokens: `transformers
serve` cannot ignore eos, so a stream that stops early counts what it produced (`completion tok`).

A system under test is anything with `name`, `base_url`, `model_name`, `request_extras`,
`request_headers()`, `start()`, `stop()`, `peak_rss_mib()` and `stats()`; the load runner knows
nothing else about it.

NOTE: load is driven by a minimal HTTP/1.1 client (scripts/benchkit/rawhttp.py), not the openai
SDK, which costs about a core by itself at 2-4k chunks/s, nor httpx, which took ~17 ms
of CPU per 64-token stream (this client ~6 ms). The client still shares the machine's cores with
the server; the report records nproc, the load average and the client's own CPU seconds so that
can be judged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from models.runner.cpus import available_cpus, prefill_thread_count  # no torch: this process stays free of it
from scripts.benchkit import llama, prefix, prefix_run, roofline, structured
from scripts.benchkit.ceiling import CEILING_PROMPT_TOKENS, ceiling_worker, thread_counts
from scripts.benchkit.load import (
    DEFAULT_PROMPT_WORDS,
    LoadSpec,
    RequestResult,
    SystemUnderTest,
    arrival_times,
    run_load,
    stream_chat,
    summarize,
)
from scripts.benchkit.plots import is_plottable, write_plots
from scripts.benchkit.report import COLUMNS, VS_OFF_COLUMNS, add_vs_off, format_cell, markdown_table, render
from scripts.benchkit.structured import StructuredSpec
from scripts.harness.procs import cpu_model
from scripts.harness.redis_server import RedisServer
from scripts.harness.servers import REPO_ROOT, ServerProcess, surge_argv
from scripts.harness.stats import percentile
from scripts.load_memory import SHAPES

__all__ = [
    "COLUMNS",
    "VS_OFF_COLUMNS",
    "LoadSpec",
    "RequestResult",
    "format_cell",
    "markdown_table",
    "percentile",
    "stream_chat",
]


# ---------------------------------------------------------------- systems under test


class Sidecar(Protocol):
    """A process a server needs (e.g. Redis): started before it, stopped after it."""

    def start(self) -> dict[str, str]: ...  # argv fields for the server, e.g. {"redis_url": ...}
    def stop(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...


def no_headers() -> dict[str, str]:
    return {}


def idempotency_key_headers() -> dict[str, str]:
    """A fresh key per request, so the idempotency layer claims, records and stores every response."""
    return {"Idempotency-Key": str(uuid.uuid4())}


class RedisSidecar:
    """A throwaway `redis-server` for a stack mode that shares state through Redis."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.server: RedisServer | None = None
        self.commands_at_start: int | None = None

    def start(self) -> dict[str, str]:
        self.server = RedisServer(log_path=self.log_path)  # raises when redis-server is not installed
        self.server.start()
        self.commands_at_start = self.server.commands_processed()
        return {"redis_url": self.server.url}

    def stats(self) -> dict[str, Any]:
        """Commands the server sent Redis (warmup included): evidence that the mode really used Redis."""
        if self.server is None or self.commands_at_start is None:
            return {}
        with contextlib.suppress(OSError, RuntimeError):
            # minus 1: the INFO that read `commands_at_start` counts once it has run.
            return {"redis_commands": self.server.commands_processed() - self.commands_at_start - 1}
        return {}

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@dataclass
class BenchServer:
    """An OpenAI-compatible server under test: a harness `ServerProcess` (argv may hold `{port}` and
    the fields its sidecars' `start()` return) with what the load runner needs to talk to it.

    NOTE: each in a session of its own (scripts/harness/servers.py), as a server on its own machine:
    the kernel's autogroup then shares the CPU between it and the load client as two groups.
    """

    name: str
    argv: list[str]
    model_name: str
    log_path: Path
    ready_path: str = "/ready"
    request_extras: dict[str, Any] = field(default_factory=dict)
    request_headers: Callable[[], dict[str, str]] = no_headers
    sidecars: list[Sidecar] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment
    startup_timeout_s: float = 300.0
    process: ServerProcess | None = None

    @property
    def base_url(self) -> str:
        return self.process.url if self.process is not None else ""

    def start(self) -> None:
        fields: dict[str, str] = {}
        for sidecar in self.sidecars:
            fields |= sidecar.start()
        self.process = ServerProcess(
            self.name,
            self.argv,
            self.log_path,
            ready_path=self.ready_path,
            env={**os.environ, **self.env},
            fields=fields,
            ready_timeout_s=self.startup_timeout_s,
            own_session=True,
        )
        self.process.start()

    def peak_rss_mib(self) -> float | None:
        """The server's peak RSS: the sum of each of its processes' peaks (surge's engine runs in
        a child process; children are read while the server runs)."""
        if self.process is None:
            return None
        peak = self.process.peak_rss_bytes()
        return peak / 2**20 if peak else None

    def stats(self) -> dict[str, Any]:
        return {key: value for sidecar in self.sidecars for key, value in sidecar.stats().items()}

    def stop(self) -> None:
        try:
            if self.process is not None:
                self.process.stop()
        finally:
            for sidecar in reversed(self.sidecars):  # after the server, which may still be talking to them
                sidecar.stop()


@dataclass(frozen=True)
class StackMode:
    """One setting of surge's traffic middleware stack, for `--stack` (issue 3: what does it cost?)."""

    name: str
    surge_args: tuple[str, ...]
    uses_idempotency_keys: bool  # every request carries a fresh key
    uses_redis: bool  # the bench starts a redis-server and fills `{redis_url}`


# The whole traffic stack switched off (rate limits are off by default; said here anyway).
_STACK_OFF_ARGS: tuple[str, ...] = ("--rate-limit-rpm", "0", "--rate-limit-tpm", "0", "--dedup-ttl-seconds", "0")
_STACK_OFF_ARGS += ("--degrade-thresholds", "off", "--max-queued-requests", "0", "--max-queue-seconds", "0")
# On: rate limits far above anything a bench sends, so every request pays the bucket check and none is
# refused; dedup, degradation and the bounded queue at the server's defaults.
_STACK_ON_ARGS = ("--rate-limit-rpm", "1000000", "--rate-limit-tpm", "1000000000")
STACK_MODES = {
    mode.name: mode
    for mode in (
        StackMode("off", _STACK_OFF_ARGS, uses_idempotency_keys=False, uses_redis=False),
        StackMode("memory", _STACK_ON_ARGS, uses_idempotency_keys=True, uses_redis=False),
        StackMode(
            "redis", (*_STACK_ON_ARGS, "--redis-url", "{redis_url}"), uses_idempotency_keys=True, uses_redis=True
        ),
        # Not a traffic layer: the stack off, with the adaptive batch-size rule instead of continuous
        # batching (models/scheduler/batch_policy.py), for `--stack off,log-batch`.
        StackMode(
            "log-batch", (*_STACK_OFF_ARGS, "--batch-policy", "log"), uses_idempotency_keys=False, uses_redis=False
        ),
    )
}


def surge_server(
    model_dir: Path, concurrency: int, args: argparse.Namespace, stack: StackMode | None = None
) -> BenchServer:
    """`surge serve` as the bench runs it; `stack=None` is the plain run at the server's defaults."""
    argv = surge_argv(model_dir, "--num-threads", str(args.threads), "--max-num-seqs", str(max(concurrency, 32)))
    argv += ["--device", args.device, "--dtype", args.dtype]
    argv += ["--prefill-threads", str(args.prefill_threads), "--quantization", args.quantization]
    if args.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if stack is not None:
        argv += stack.surge_args
    # Per-request access-log lines are work a production deployment would not do. No drain delay on
    # SIGTERM: no load balancer is listening, and the default 2 s was 2.6 s of each server's stop.
    argv += ["--log-level", "warning", "--shutdown-delay-seconds", "0", *args.surge_arg]
    if stack is None:
        log_path = args.out.parent / f"surge-c{concurrency}.log"
        return BenchServer("surge", argv, str(model_dir), log_path, request_extras={"ignore_eos": True})
    log_path = args.out.parent / f"surge-{stack.name}-c{concurrency}.log"
    sidecars: list[Sidecar] = []
    if stack.uses_redis:
        sidecars.append(RedisSidecar(args.out.parent / f"redis-{stack.name}-c{concurrency}.log"))
    return BenchServer(
        f"surge[{stack.name}]",
        argv,
        str(model_dir),
        log_path,
        request_extras={"ignore_eos": True},
        request_headers=idempotency_key_headers if stack.uses_idempotency_keys else no_headers,
        sidecars=sidecars,
    )


# transformers' console script, run as a module of this interpreter: where transformers is
# installed with `pip --target` (as on a lent GPU machine) the script is not beside the interpreter.
TRANSFORMERS_CLI = (sys.executable, "-m", "transformers.cli.transformers")


def transformers_serve_installed() -> bool:
    """`transformers serve` needs the `bench` extra (accelerate, rich, openai, ...) on top of surge's own."""
    modules = ("transformers", "accelerate", "rich", "openai", "fastapi", "uvicorn")
    return all(importlib.util.find_spec(name) for name in modules)


def transformers_server(
    model_dir: Path, concurrency: int, args: argparse.Namespace, seq_tokens: int = 512
) -> BenchServer:
    """`transformers serve --continuous-batching`, with its best CPU settings.

    Its defaults cost about 14 s on the first request and 6-9 GB; a 1024-token batch and a small KV
    pool bring that to 0.1 s and about 0.5 GB. The pool (pages of 256 tokens) grows with the
    concurrency so that every stream of `seq_tokens` fits at once. It rejects unknown fields (no `ignore_eos`: the
    tiny models rarely stop early, and tokens/s counts the tokens each stream really produced), ends
    streams without `[DONE]` and has no /ready, so readiness is GET /v1/models.
    """
    argv = [*TRANSFORMERS_CLI, "serve", str(model_dir), "--device", args.device, "--dtype", args.dtype]
    argv += ["--continuous-batching"]
    argv += ["--cb-max-batch-tokens", "1024", "--cb-num-blocks", str(max(64, -(-seq_tokens // 256) * concurrency))]
    argv += ["--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning"]
    # torch reads OMP_NUM_THREADS at import: the same thread count as surge's --num-threads.
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.peer_threads)}
    log_path = args.out.parent / f"transformers-c{concurrency}.log"
    return BenchServer("transformers", argv, str(model_dir), log_path, ready_path="/v1/models", env=env)


def naive_server(model_dir: Path, concurrency: int, args: argparse.Namespace) -> BenchServer:
    """scripts/naive_server.py: FastAPI calling `model.generate` for one request at a time."""
    argv = [sys.executable, "-m", "scripts.naive_server", "--model", str(model_dir)]
    argv += ["--port", "{port}", "--num-threads", str(args.peer_threads)]
    log_path = args.out.parent / f"naive-c{concurrency}.log"
    return BenchServer(
        "naive", argv, str(model_dir), log_path, ready_path="/health", request_extras={"ignore_eos": True}
    )


def llama_server_problem(args: argparse.Namespace) -> str | None:
    """Why `llama-server` cannot run (None: it can, or --build-llama-server builds it)."""
    if args.build_llama_server:
        return None
    if args.llama_server is None or args.gguf is None:
        return "needs --build-llama-server, or --llama-server PATH and --gguf PATH"
    if not (args.llama_server.is_file() and os.access(args.llama_server, os.X_OK)):
        return f"{args.llama_server} is not an executable file"
    return None if args.gguf.is_file() else f"{args.gguf} is not a file"


def llama_server(
    concurrency: int, args: argparse.Namespace, seq_tokens: int = 2048, threads: tuple[int, int] | None = None
) -> BenchServer:
    """llama.cpp's `llama-server` on `--gguf`: one slot per stream (`-np`), continuous batching, on
    `threads` (its decode `-t` and batch `-tb` threads; None: `--llama-threads` for both, its best).

    NOTE: `-c` is the context of all slots together, split evenly: `seq_tokens` each. Its prefix
    reuse (`cache_prompt`, per slot) shows in `timings`, not `prompt_tokens_details`: hit rate unknown.
    """
    decode, batch = threads or (args.llama_threads, args.llama_threads)
    argv = [str(args.llama_server), "-m", str(args.gguf), "-np", str(concurrency), "-c", str(concurrency * seq_tokens)]
    argv += ["-t", str(decode), "-tb", str(batch), "--cont-batching"]
    argv += ["--host", "127.0.0.1", "--port", "{port}"]
    log_path = args.out.parent / f"llama-server-c{concurrency}.log"
    extras = {"ignore_eos": True}
    return BenchServer("llama-server", argv, args.gguf.stem, log_path, ready_path="/health", request_extras=extras)


SYSTEMS = ("surge", "transformers", "naive", "llama-server")


def make_server(
    system: str, model_dir: Path, concurrency: int, args: argparse.Namespace, stack: StackMode | None = None
) -> BenchServer:
    """The server one `--systems` name stands for (`stack` applies to surge only)."""
    if system == "transformers":
        return transformers_server(model_dir, concurrency, args)
    if system == "naive":
        return naive_server(model_dir, concurrency, args)
    if system == "llama-server":
        return llama_server(concurrency, args)
    return surge_server(model_dir, concurrency, args, stack)


# The prefix workloads' two surge: the traffic stack off in both (degradation would step in at
# different loads and cut the slower one's streams), so that what differs is the prefix cache.
_PREFIX_ARGS = _STACK_OFF_ARGS
PREFIX_SURGE = {
    "surge": StackMode("cache-on", _PREFIX_ARGS, uses_idempotency_keys=False, uses_redis=False),
    "surge[cache-off]": StackMode(
        "cache-off", (*_PREFIX_ARGS, "--prefix-caching", "off"), uses_idempotency_keys=False, uses_redis=False
    ),
}


def workload_servers(
    system: str, model_dir: Path, spec: prefix.WorkloadSpec, args: argparse.Namespace
) -> list[BenchServer]:
    """The servers one `--systems` name stands for in a prefix workload (surge: both cache modes)."""
    seq_tokens = args.prefix_tokens + spec.num_turns * (spec.max_tokens + 64) + 64  # the longest history, and room
    if spec.workload == "responses-chain" and system != "surge":
        return []  # the peers keep no responses: no previous_response_id (scripts/benchkit/prefix_responses.py)
    if system == "surge":
        return [
            replace(surge_server(model_dir, spec.concurrency, args, mode), name=name)
            for name, mode in PREFIX_SURGE.items()
        ]
    if system == "transformers":
        return [transformers_server(model_dir, spec.concurrency, args, seq_tokens)]
    if system == "llama-server":  # on surge's threads, as the documented prefix runs were
        return [llama_server(spec.concurrency, args, seq_tokens, (args.peer_threads, args.prefill_threads))]
    return [make_server(system, model_dir, spec.concurrency, args)]


def default_systems(args: argparse.Namespace) -> list[str]:
    """Smoke and `--stack` runs measure surge alone; a full run every system that is installed."""
    # Skipped with a note where it cannot run.
    llama = ["llama-server"] if args.llama_server is not None or args.build_llama_server else []
    if args.smoke or args.stack is not None:
        return ["surge"]
    peers = ["transformers"] if transformers_serve_installed() else []
    return ["surge", *peers, *llama] if args.workload else ["surge", *peers, "naive", *llama]


# ---------------------------------------------------------------- load runner


def num_requests(spec: LoadSpec) -> int:
    if spec.rate is None:
        return spec.concurrency * spec.requests_per_client
    return len(arrival_times(spec.rate, spec.duration_s, spec.seed))


def load_label(spec: LoadSpec) -> str:
    return "closed" if spec.rate is None else f"poisson {spec.rate:g}/s"


def measure(
    sut: SystemUnderTest, spec: LoadSpec, on_done: Callable[[], None] | None = None
) -> tuple[dict[str, Any], list[RequestResult]]:
    """Start `sut`, warm it up, run the load, stop it. A failed start counts every request as failed."""
    concurrency = spec.concurrency if spec.rate is None else None
    row: dict[str, Any] = {"system": sut.name, "concurrency": concurrency, "load": load_label(spec)}
    if spec.rate is not None:
        row |= {"rate_rps": spec.rate, "duration_s": spec.duration_s}
    try:
        sut.start()
        warmup = LoadSpec(min(spec.concurrency, 4), 1, min(spec.max_tokens, 8), spec.prompt_words, seed=1)
        asyncio.run(run_load(sut, warmup))
        row["loadavg_1m_before"] = os.getloadavg()[0]
        results, wall_s, row["client_cpu_s"] = asyncio.run(run_load(sut, spec, on_done))
        row["peak_rss_mib"] = sut.peak_rss_mib()
        row |= sut.stats()
    except Exception as exc:  # a broken system is a result, not the end of the benchmark
        results, wall_s = [RequestResult(error=f"{type(exc).__name__}: {exc}")], 0.0
    finally:
        sut.stop()
    return {**row, **summarize(results, wall_s)}, results


def combine_rounds(rows: list[dict[str, Any]], results: list[list[RequestResult]]) -> list[dict[str, Any]]:
    """One row per system and concurrency from its rounds: medians of tokens/s, req/s and the ratio
    to that round's ceiling (the ratio is taken within a round, where the drift is shared); latency
    percentiles over every round's requests pooled; errors summed; the largest peak RSS."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault((row["system"], row.get("stack"), row["concurrency"], row["load"]), []).append(index)
    combined = []
    for indices in groups.values():
        members = [rows[i] for i in indices]
        row = dict(members[-1])
        if row["system"] != "ceiling":
            pooled = [r for i in indices for r in results[i]]
            row |= summarize(pooled, sum(m["wall_s"] for m in members))
            row["errors"] = sorted({e for m in members for e in m["errors"]})[:5]
            rss = [m["peak_rss_mib"] for m in members if m.get("peak_rss_mib") is not None]
            row["peak_rss_mib"] = max(rss) if rss else None
            for key in ("requests_per_s", "vs_ceiling"):
                values = [m[key] for m in members if m.get(key) is not None]
                row[key] = statistics.median(values) if values else None
        row["tokens_per_s"] = statistics.median(m["tokens_per_s"] for m in members)
        row["rounds"] = len(members)
        row.pop("round", None)
        combined.append(row)
    return combined


# ---------------------------------------------------------------- raw ceiling and model (subprocesses)


def run_python(argv: list[str], what: str) -> str:
    """Run `python argv...` in the repo root; return its last stdout line. Keeps torch out of this process."""
    proc = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def run_ceiling(model_dir: Path, batch: int, new_tokens: int, device: str, dtype: str) -> dict[str, Any]:
    """scripts/benchkit/ceiling.py in a subprocess, at every thread count this process may use (on
    a GPU one count, every CPU: there threads only launch kernels)."""
    params = {"model_dir": str(model_dir), "batch": batch, "new_tokens": new_tokens, "runs": 2}
    on_cpu = device == "cpu"
    params |= {"device": device, "dtype": dtype}
    params["threads"] = thread_counts(available_cpus()) if on_cpu else [available_cpus()]
    out = run_python(["-m", "scripts.bench", "--ceiling-worker", json.dumps(params)], "the ceiling run")
    return dict(json.loads(out))


def ensure_model(size: str, cache_dir: Path) -> Path:
    code = "import sys; from pathlib import Path; from models.loading.tiny import ensure_tiny; "
    code += "print(ensure_tiny(Path(sys.argv[1]), sys.argv[2]))"
    return Path(run_python(["-c", code, str(cache_dir), size], f"building the {size} model"))


def ensure_shape(shape: str, cache_dir: Path) -> Path:
    """A real-size shape's directory, built in a subprocess, as `ensure_model`, to keep torch out of here."""
    code = "import sys; from pathlib import Path; from scripts.load_memory import build, shape_dir; "
    code += "print(build(sys.argv[2], shape_dir(Path(sys.argv[1]), sys.argv[2])).resolve())"
    return Path(run_python(["-c", code, str(cache_dir), shape], f"building the {shape} shape"))


# ---------------------------------------------------------------- report


def machine_info(device: str = "cpu") -> dict[str, Any]:
    cpu = cpu_model()
    # The installed distribution's version is torch.__version__ ("2.13.0+cpu"), read without a
    # subprocess that imports torch: that one took 3.9 s of every run on the 2-core VM.
    torch_version = importlib.metadata.version("torch")
    python = platform.python_version()
    info = {"nproc": os.cpu_count(), "cpu": cpu, "torch": torch_version, "python": python, "loadavg": os.getloadavg()}
    return info | ({"gpu": gpu_names()} if device != "cpu" else {})


def gpu_names() -> str:
    """The GPUs nvidia-smi names (without importing torch here), or why it could not say."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({type(exc).__name__})"
    return "; ".join(proc.stdout.strip().splitlines()) or f"unknown (nvidia-smi exit {proc.returncode})"


# ---------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", choices=("s", "m", "l"), default="m")
    parser.add_argument("--model-dir", type=Path, help="use this model directory instead of building a tiny one")
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), help="a real-size Qwen2.5 shape with random weights instead, built once"
    )
    parser.add_argument("--cache-dir", type=Path, default=REPO_ROOT / ".cache" / "bench-models")
    parser.add_argument("--concurrency", help="comma-separated, e.g. 1,8,32 (default 1,8,32,64; --workload: one)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per request (and for the ceiling)")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--prompt-words", type=int, default=DEFAULT_PROMPT_WORDS)
    parser.add_argument(
        "--threads",
        default="auto",
        help="surge's --num-threads (`auto`: measured at its warm-up); a count also sets the other "
        "Python servers' torch threads (with `auto`, 1)",
    )
    parser.add_argument(
        "--prefill-threads",
        type=int,
        default=0,
        help="surge's --prefill-threads, and the ceiling's threads for its prefill; 0 = every available CPU",
    )
    parser.add_argument("--max-num-batched-tokens", type=int, help="passed to surge; default: the server's own")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where surge, `transformers serve` and the ceiling run (llama-server and naive: the CPU only)",
    )
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="the same three's weights"
    )
    parser.add_argument("--surge-arg", action="append", default=[], help="extra `surge serve` argument (repeatable)")
    parser.add_argument(
        "--stack",
        help=f"comma-separated traffic-stack modes ({', '.join(STACK_MODES)}), one surge run each; "
        "default: one run at the server's defaults",
    )
    parser.add_argument(
        "--systems",
        help=f"comma-separated, among {', '.join(SYSTEMS)}; default: every one installed (surge alone with "
        "--smoke or --stack)",
    )
    parser.add_argument(
        "--rate", type=float, help="also run an open loop: Poisson arrivals at this many requests/s per system"
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals for --rate")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="closed-loop measurements per system and concurrency, interleaved (ceiling, surge, peer, ...) "
        "so that the machine's drift hits every system alike; rows report the median (naive runs once)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--no-ceiling", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench-results" / "bench.md")
    parser.add_argument("--smoke", action="store_true", help="seconds long: size s, concurrency 4, 8 tokens, 1 each")
    parser.add_argument(
        "--structured",
        action="store_true",
        help="structured outputs under load instead (scripts/benchkit/structured.py): plain against half"
        " json_schema at the largest --concurrency, and new schemas arriving while streams run",
    )
    prefix_run.add_arguments(parser)  # --workload, --prefix-tokens
    parser.add_argument(
        "--llama-server", type=Path, help="an existing llama.cpp llama-server binary (system `llama-server`)"
    )
    parser.add_argument("--gguf", type=Path, help="the GGUF model llama-server serves")
    parser.add_argument(
        "--quantization",
        choices=("none", "int8"),
        default="none",
        help="surge's --quantization; with int8, --build-llama-server serves a Q8_0 GGUF of the same weights",
    )
    parser.add_argument(
        "--llama-threads",
        type=int,
        default=0,
        help="llama-server's -t and -tb outside --workload (0 = every available CPU: its best on 2 cores)",
    )
    parser.add_argument(
        "--llama-build",
        choices=sorted(llama.BUILDS),
        default="native",
        help="which llama.cpp build --build-llama-server makes and runs: -march=native, or AVX-512 without AMX",
    )
    parser.add_argument(
        "--build-llama-server",
        action="store_true",
        help="build llama-server from the llama-cpp-python source package (once, ~13 min on 2 cores, cached"
        " in --cache-dir/llama.cpp) and convert the model to the GGUF of the same weights (f32, bf16 or Q8_0 by --dtype"
        " and --quantization; scripts/benchkit/llama.py)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.model_size, args.concurrency, args.max_tokens, args.requests_per_client = "s", "4", 8, 1
    if args.device != "cpu" and args.build_llama_server:
        parser.error("--build-llama-server: llama-server runs on the CPU here, not with --device cuda")
    args.concurrency_given = args.concurrency is not None
    args.concurrency = [int(c) for c in str(args.concurrency or "1,8,32,64").split(",") if c.strip()]
    if (problem := prefix_run.check_args(args)) is not None:
        parser.error(problem)
    if not args.concurrency or min(args.concurrency) < 1 or args.max_tokens < 1 or args.requests_per_client < 1:
        parser.error("--concurrency, --max-tokens and --requests-per-client must be positive")
    if args.stack is not None:
        names = [name.strip() for name in args.stack.split(",") if name.strip()]
        unknown = sorted(set(names) - set(STACK_MODES))
        if not names or unknown or len(set(names)) != len(names):
            parser.error(f"--stack takes distinct modes among {', '.join(STACK_MODES)}; got {args.stack!r}")
        args.stack = [STACK_MODES[name] for name in names]
    if args.systems is None:
        args.systems = default_systems(args)
    else:
        names = [name.strip() for name in args.systems.split(",") if name.strip()]
        unknown = sorted(set(names) - set(SYSTEMS))
        if not names or unknown or len(set(names)) != len(names):
            parser.error(f"--systems takes distinct names among {', '.join(SYSTEMS)}; got {args.systems!r}")
        args.systems = names
    args.skipped = []
    if "llama-server" in args.systems and (problem := llama_server_problem(args)) is not None:
        args.systems.remove("llama-server")
        args.skipped.append(f"llama-server skipped: {problem}")
    if args.device != "cpu":
        for system in ("llama-server", "naive"):  # built and run for the CPU here
            if system in args.systems:
                args.systems.remove(system)
                args.skipped.append(f"{system} skipped: CPU only, and --device is {args.device}")
        if args.quantization != "none":
            parser.error("--quantization int8 runs on the CPU only (oneDNN's kernels)")
    if not args.systems:
        parser.error(f"no system left to run ({'; '.join(args.skipped)})")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.prefill_threads < 0:
        parser.error("--prefill-threads must be 0 (every available CPU) or positive")
    if args.threads != "auto" and not args.threads.isdigit():
        parser.error("--threads takes `auto` or a count")
    args.peer_threads = 1 if args.threads == "auto" else int(args.threads)
    args.prefill_threads = prefill_thread_count(args.peer_threads, args.prefill_threads)
    args.llama_threads = args.llama_threads or available_cpus()
    if args.rate is not None and (args.rate <= 0 or args.duration <= 0):
        parser.error("--rate and --duration must be positive")
    return args


def run_structured(model_dir: Path, args: argparse.Namespace, command: str, machine: dict[str, Any]) -> int:
    concurrency = max(args.concurrency)
    spec = StructuredSpec(concurrency, args.requests_per_client, args.max_tokens, max(args.rounds, 1))
    server = surge_server(model_dir, concurrency, args)
    server.start()
    try:
        report = structured.run(server.base_url, server.model_name, spec, log=lambda line: print(line, flush=True))
    finally:
        server.stop()
    table = structured.render(report, spec, command, machine)
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "machine": machine} | report, indent=1))
    return 1 if any(row["errors"] for row in report["rows"]) else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--ceiling-worker"]:
        print(json.dumps(ceiling_worker(**json.loads(argv[1]))))
        return 0
    args = parse_args(argv)
    command = shlex.join(sys.orig_argv)
    machine = machine_info(args.device)
    if args.model_dir:
        model_dir = args.model_dir.resolve()
    elif args.shape:
        model_dir = ensure_shape(args.shape, args.cache_dir)
    else:
        model_dir = ensure_model(args.model_size, args.cache_dir)
    if args.structured:
        return run_structured(model_dir, args, command, machine)
    if args.build_llama_server and "llama-server" in args.systems:
        llama_dir = args.cache_dir / "llama.cpp"
        args.llama_server = args.llama_server or llama.ensure_llama_server(llama_dir, args.llama_build)
        outtype = llama.gguf_type(args.dtype, args.quantization)
        args.gguf = args.gguf or llama.ensure_gguf(model_dir, llama_dir, outtype)
    if args.workload:

        def servers(spec: prefix.WorkloadSpec) -> list[SystemUnderTest]:
            return [sut for system in args.systems for sut in workload_servers(system, model_dir, spec, args)]

        return prefix_run.main(model_dir, args, command, machine, servers)
    open_loop = f"; open loop: Poisson {args.rate:g} req/s for {args.duration:g} s" if args.rate else ""
    on_gpu = ""
    if args.device != "cpu":
        on_gpu = f"Device {args.device}, {args.dtype} (surge, `transformers serve`, the ceiling). "
    note = (
        on_gpu + f"Model `{model_dir.name}`; {args.max_tokens} new tokens per request, greedy, ignore_eos where the "
        f"server takes it (not `transformers serve`: its tokens/s counts the tokens it really produced, see "
        f"`completion tok`); {args.requests_per_client} request(s) per client, closed loop{open_loop}; "
        f"threads: surge --num-threads {args.threads} --prefill-threads {args.prefill_threads}, naive and "
        f"transformers {args.peer_threads}, llama-server -t {args.llama_threads} -tb {args.llama_threads}. "
        f"Ceiling: batch = concurrency, {CEILING_PROMPT_TOKENS}-token prompts, the best of a hand-written greedy "
        f"decode loop and HF generate at 1-{available_cpus()} torch threads, with torch's linear kernels and "
        "oneDNN's packed ones, each the best of 2 after a warmup (scripts/benchkit/ceiling.py)."
        + (
            f" Weights: surge --quantization int8, llama-server `{args.gguf.name if args.gguf else '--gguf'}`; the "
            "ceiling and the Python peers in float32."
            if args.quantization == "int8"
            else ""
        )
        + (
            f" {args.rounds} rounds, interleaved (each round: the ceiling, then every system on a fresh server;"
            " naive in the first only); tokens/s, req/s and vs ceiling are medians of the rounds, latencies"
            " pool every round's requests."
            if args.rounds > 1
            else ""
        )
        + "".join(f" {line}." for line in args.skipped)
    )
    print(f"Command: {command}\nMachine: {machine}\nModel: {model_dir}\nSystems: {args.systems}", flush=True)
    runs: list[tuple[LoadSpec, str, StackMode | None, int]] = []  # every measurement, in order
    specs = [LoadSpec(c, args.requests_per_client, args.max_tokens, args.prompt_words) for c in args.concurrency]
    if args.rate is not None:
        specs.append(LoadSpec(4, 1, args.max_tokens, args.prompt_words, rate=args.rate, duration_s=args.duration))
    for spec in specs:
        for round_ in range(args.rounds if spec.rate is None else 1):
            for system in args.systems:
                if system == "naive" and round_ > 0:
                    continue  # ten times slower than the others: drift cannot move its ratios, and it takes long
                stacks: list[StackMode | None] = (args.stack or [None]) if system == "surge" else [None]
                runs += [(spec, system, stack, round_) for stack in stacks]
    rows: list[dict[str, Any]] = []  # one per measurement (per round)
    raw: list[dict[str, Any]] = []
    results_by_row: list[list[RequestResult]] = []
    ceilings: dict[tuple[int, int], dict[str, Any]] = {}  # (concurrency, round) -> the ceiling's row
    bar = tqdm(total=sum(num_requests(spec) for spec, _, _, _ in runs), unit="req", file=sys.stderr)
    bar.disable = args.no_progress
    with bar:
        for spec, system, stack, round_ in runs:
            concurrency = spec.concurrency
            if spec.rate is None and not args.no_ceiling and (concurrency, round_) not in ceilings:
                bar.set_description(f"ceiling B={concurrency}")
                ceiling = run_ceiling(model_dir, concurrency, args.max_tokens, args.device, args.dtype)
                ceiling_row = {"system": "ceiling", "concurrency": concurrency, "load": "batch", "round": round_}
                rows.append(ceiling_row | ceiling)
                results_by_row.append([])
                ceilings[concurrency, round_] = rows[-1]
                bar.write(
                    f"ceiling B={concurrency}: {ceiling['tokens_per_s']:.1f} tok/s ({ceiling['ceiling_method']}, "
                    f"{ceiling['ceiling_kernels']} kernels, {ceiling['ceiling_threads']} threads)",
                    file=sys.stdout,
                )
            sut = make_server(system, model_dir, concurrency, args, stack)
            bar.set_description(f"{sut.name} {load_label(spec) if spec.rate else f'c={concurrency}'}")
            done_before = bar.n
            row, results = measure(sut, spec, on_done=lambda: bar.update(1))
            bar.update(max(0, done_before + num_requests(spec) - bar.n))  # a failed start, or fewer arrivals
            row["round"] = round_
            if stack is not None:
                row["stack"] = stack.name
            same_round = ceilings.get((concurrency, round_)) if spec.rate is None else None
            if same_round is not None and row["tokens_per_s"]:
                row["vs_ceiling"] = row["tokens_per_s"] / same_round["tokens_per_s"]
            rows.append(row)
            results_by_row.append(results)
            raw.append(
                {"system": sut.name, "concurrency": row["concurrency"], "load": row["load"], "round": round_}
                | {"requests": [{k: v for k, v in asdict(r).items() if k != "text"} for r in results]}
            )
            redis_note = f", {row['redis_commands']} redis commands" if "redis_commands" in row else ""
            bar.write(
                f"{sut.name} {row['load']} c={row['concurrency']}: {row['tokens_per_s']:.1f} tok/s, "
                f"{row['completion_tokens']} tokens, {row['num_errors']} errors{redis_note}",
                file=sys.stdout,
            )
            for error in row["errors"]:
                bar.write(f"  error: {error}", file=sys.stderr)

    round_rows = rows
    if args.rounds > 1:
        rows = combine_rounds(round_rows, results_by_row)
    add_vs_off(rows)
    table = render(rows, machine, command, note, round_rows if args.rounds > 1 else None)
    peaks = None
    if args.device == "cpu" and not args.smoke:  # every report reads its figures against this machine's limits
        peaks = roofline.measure_peaks(available_cpus())
        dtype = "int8" if args.quantization == "int8" else args.dtype
        costs = roofline.model_costs(model_dir)
        table += "\n".join(roofline.render_decode_rows(rows, costs, peaks, dtype, args.max_tokens)) + "\n"
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    report = {"command": command, "machine": machine, "model_dir": str(model_dir), "rows": rows, "raw": raw}
    report["peaks"] = peaks
    if args.rounds > 1:
        report["round_rows"] = round_rows
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    if not args.no_plots and is_plottable():
        for path in write_plots(rows, args.out.parent, title=model_dir.name):
            print(f"plot: {path}", flush=True)
    return 1 if any(row.get("num_errors") for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
