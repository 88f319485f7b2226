"""Serving benchmark: streaming load against each system under test, next to the raw decode ceiling.

    .venv/bin/python scripts/bench.py --model-size m --concurrency 32
    .venv/bin/python scripts/bench.py --smoke --out /tmp/bench.md   # seconds long, for CI
    .venv/bin/python scripts/bench.py --stack off,memory,redis        # the traffic stack's cost

For each concurrency B, one measurement after another so nothing overlaps:
- `ceiling`: the model in a fresh subprocess, batch B, 32 random prompt tokens, one prefill and a
  hand-written greedy decode loop over a `DynamicCache`; tokens/s of the best of 2 runs after a warmup.
- each system under test (today `surge`): started fresh, warmed up, then B closed-loop workers that
  each stream `--requests-per-client` chat completions back to back over one `httpx.AsyncClient`.
  With `--stack`, one fresh surge per traffic-stack mode (see `STACK_MODES`), rows `surge[MODE]`,
  and a "vs stack off" section: each mode's tokens/s and TTFT p50 over `off`'s at the same B.

A system under test is anything with `name`, `base_url`, `model_name`, `request_extras`,
`request_headers()`, `start()`, `stop()`, `peak_rss_mib()` and `stats()`; the load runner knows
nothing else about it.

NOTE: load is driven with raw httpx, not the openai SDK, which costs about a core by itself
(FACTS.md, "Load clients"). The client still shares the machine's cores with the server; the
report records nproc, the load average and the client's own CPU seconds so that can be judged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
CEILING_PROMPT_TOKENS = 32
# 8 words come to 27-38 (mean 32) prompt tokens with the tiny model's tokenizer and ChatML template.
DEFAULT_PROMPT_WORDS = 8
WORD_POOL = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line"
)


# ---------------------------------------------------------------- systems under test


class SystemUnderTest(Protocol):
    name: str
    base_url: str  # valid once start() has returned
    model_name: str  # the `model` field requests must carry
    request_extras: dict[str, Any]  # extra request-body fields it accepts (e.g. ignore_eos)

    def request_headers(self) -> dict[str, str]: ...  # once per request (e.g. a fresh Idempotency-Key)
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def peak_rss_mib(self) -> float | None: ...
    def stats(self) -> dict[str, Any]: ...  # extra numbers for the JSON row, read after the load


class Sidecar(Protocol):
    """A process a server needs (e.g. Redis): started before it, stopped after it."""

    def start(self) -> dict[str, str]: ...  # argv fields for the server, e.g. {"redis_url": ...}
    def stop(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def no_headers() -> dict[str, str]:
    return {}


def idempotency_key_headers() -> dict[str, str]:
    """A fresh key per request, so the idempotency layer claims, records and stores every response."""
    return {"Idempotency-Key": str(uuid.uuid4())}


@dataclass
class RedisServer:
    """A throwaway `redis-server` on a free loopback port: no persistence, its files in a temp dir."""

    log_path: Path
    startup_timeout_s: float = 10.0
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None
    tmp_dir: tempfile.TemporaryDirectory[str] | None = None
    client: Any = None  # a redis.Redis kept on one connection, so the count below includes no handshakes
    commands_at_start: int | None = None

    def start(self) -> dict[str, str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        import redis  # surge's own dependency; imported here so a plain run does not need it

        port = free_port()
        self.url = f"redis://127.0.0.1:{port}/0"
        self.tmp_dir = tempfile.TemporaryDirectory(prefix="bench-redis-")
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--dir", self.tmp_dir.name]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; log tail:\n{tail}")
            with contextlib.suppress(redis.RedisError):  # NOTE: a single-connection client connects at once
                self.client = redis.Redis.from_url(self.url, socket_timeout=2.0, single_connection_client=True)
                self.commands_at_start = self._commands_processed()
                return {"redis_url": self.url}
            time.sleep(0.05)
        raise RuntimeError(f"redis-server not answering within {self.startup_timeout_s:.0f} s (log: {self.log_path})")

    def _commands_processed(self) -> int:
        return int(self.client.info("stats")["total_commands_processed"])

    def stats(self) -> dict[str, Any]:
        """Commands the server sent Redis (warmup included): evidence that the mode really used Redis."""
        if self.commands_at_start is None:
            return {}
        import redis

        with contextlib.suppress(redis.RedisError):
            # minus 1: the INFO that read `commands_at_start` counts once it has run.
            return {"redis_commands": self._commands_processed() - self.commands_at_start - 1}
        return {}

    def stop(self) -> None:
        try:
            if self.client is not None:
                self.client.close()
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            if self.tmp_dir is not None:
                self.tmp_dir.cleanup()
                self.tmp_dir = None


@dataclass
class ServerProcess:
    """An OpenAI-compatible server run as a subprocess on a free port; ready when `ready_path` says 200.

    `argv` may contain `{port}` and the fields its sidecars' `start()` return. argv[0] must be the
    server itself (no wrapper shell), so that the pid's VmHWM is the server's peak RSS.
    """

    name: str
    argv: list[str]
    model_name: str
    log_path: Path
    ready_path: str = "/ready"
    request_extras: dict[str, Any] = field(default_factory=dict)
    request_headers: Callable[[], dict[str, str]] = no_headers
    sidecars: list[Sidecar] = field(default_factory=list)
    startup_timeout_s: float = 300.0
    base_url: str = ""
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        fields = {"port": str(free_port())}
        for sidecar in self.sidecars:
            fields |= sidecar.start()
        self.base_url = f"http://127.0.0.1:{fields['port']}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            argv = [arg.format(**fields) for arg in self.argv]
            self.proc = subprocess.Popen(
                argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before ready; log tail:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.base_url + self.ready_path, timeout=2.0).status_code == 200:
                    return
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready within {self.startup_timeout_s:.0f} s (log: {self.log_path})")

    def peak_rss_mib(self) -> float | None:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid if self.proc else 0}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB -> MiB
        return None

    def stats(self) -> dict[str, Any]:
        return {key: value for sidecar in self.sidecars for key, value in sidecar.stats().items()}

    def stop(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
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
    )
}


def surge_server(
    model_dir: Path, concurrency: int, args: argparse.Namespace, stack: StackMode | None = None
) -> ServerProcess:
    """`surge serve` as the bench runs it; `stack=None` is the plain run at the server's defaults."""
    argv = [sys.executable, "-m", "app.cli", "serve", "--model", str(model_dir), "--host", "127.0.0.1"]
    argv += ["--port", "{port}", "--num-threads", str(args.threads), "--max-num-seqs", str(max(concurrency, 32))]
    if args.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if stack is not None:
        argv += stack.surge_args
    # Per-request access-log lines are work a production deployment would not do.
    argv += ["--log-level", "warning", *args.surge_arg]
    if stack is None:
        log_path = args.out.parent / f"surge-c{concurrency}.log"
        return ServerProcess("surge", argv, str(model_dir), log_path, request_extras={"ignore_eos": True})
    log_path = args.out.parent / f"surge-{stack.name}-c{concurrency}.log"
    sidecars: list[Sidecar] = []
    if stack.uses_redis:
        sidecars.append(RedisServer(args.out.parent / f"redis-{stack.name}-c{concurrency}.log"))
    return ServerProcess(
        f"surge[{stack.name}]",
        argv,
        str(model_dir),
        log_path,
        request_extras={"ignore_eos": True},
        request_headers=idempotency_key_headers if stack.uses_idempotency_keys else no_headers,
        sidecars=sidecars,
    )


# ---------------------------------------------------------------- load runner


@dataclass
class RequestResult:
    error: str | None = None
    ttft_s: float | None = None  # until the first chunk with non-empty content
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int | None = None
    completion_tokens: int = 0


@dataclass(frozen=True)
class LoadSpec:
    concurrency: int
    requests_per_client: int
    max_tokens: int
    prompt_words: int
    seed: int = 0


async def stream_chat(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> RequestResult:
    result = RequestResult()
    content_times: list[float] = []
    finish_reason, usage = None, None
    start = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                return RequestResult(error=f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators and `:` keep-alive comments
                data = line[5:].strip()
                if data == "[DONE]":  # NOTE: not required; some servers end the stream without it
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return RequestResult(error=f"stream error: {chunk['error']}")
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        content_times.append(time.perf_counter())
                    finish_reason = choice.get("finish_reason") or finish_reason
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return RequestResult(error=f"{type(exc).__name__}: {exc}")
    result.e2e_s = time.perf_counter() - start
    if not content_times or finish_reason is None:
        result.error = f"incomplete stream: {len(content_times)} content chunks, finish_reason={finish_reason}"
        return result
    result.ttft_s = content_times[0] - start
    result.itl_s = [b - a for a, b in itertools.pairwise(content_times)]
    result.prompt_tokens = usage.get("prompt_tokens") if usage else None
    result.completion_tokens = int(usage["completion_tokens"]) if usage else len(content_times)
    return result


async def run_load(sut: SystemUnderTest, spec: LoadSpec) -> tuple[list[RequestResult], float, float]:
    """Closed loop: `concurrency` workers each send `requests_per_client` requests back to back.

    Returns (results, wall seconds of the whole load, CPU seconds this client process used).
    """
    rng, per_client = random.Random(spec.seed), spec.requests_per_client
    words = WORD_POOL.split()
    # Every request gets its own prompt, so no server can answer one from a prefix cache.
    prompts = [" ".join(rng.choices(words, k=spec.prompt_words)) for _ in range(spec.concurrency * per_client)]
    url = f"{sut.base_url}/v1/chat/completions"
    body = {"model": sut.model_name, "max_tokens": spec.max_tokens, "temperature": 0, "stream": True}
    body |= {"stream_options": {"include_usage": True}, **sut.request_extras}
    limits = httpx.Limits(max_connections=spec.concurrency + 8, max_keepalive_connections=spec.concurrency + 8)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0)) as client:

        async def worker(index: int) -> list[RequestResult]:
            mine = prompts[index * per_client : (index + 1) * per_client]
            return [
                await stream_chat(
                    client, url, {**body, "messages": [{"role": "user", "content": p}]}, sut.request_headers()
                )
                for p in mine
            ]

        cpu_start, start = time.process_time(), time.perf_counter()
        per_worker = await asyncio.gather(*(worker(i) for i in range(spec.concurrency)))
        wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    return [r for results in per_worker for r in results], wall_s, cpu_s


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(results: list[RequestResult], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    num_tokens = sum(r.completion_tokens for r in ok)
    summary: dict[str, Any] = {
        "num_requests": len(results),
        "num_errors": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "completion_tokens": num_tokens,
        "mean_prompt_tokens": sum(prompt) / len(prompt) if prompt else None,
        "wall_s": wall_s,
        "tokens_per_s": num_tokens / wall_s if wall_s > 0 else 0.0,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
    }
    samples: dict[str, list[float | None]] = {"ttft": [r.ttft_s for r in ok], "e2e": [r.e2e_s for r in ok]}
    samples["itl"] = [gap for r in ok for gap in r.itl_s]
    for name, values in samples.items():
        for q in (50, 99):
            summary[f"{name}_p{q}_s"] = percentile([v for v in values if v is not None], q)
    return summary


def measure(sut: SystemUnderTest, spec: LoadSpec) -> tuple[dict[str, Any], list[RequestResult]]:
    """Start `sut`, warm it up, run the load, stop it. A failed start counts every request as failed."""
    row: dict[str, Any] = {"system": sut.name, "concurrency": spec.concurrency}
    try:
        sut.start()
        warmup = LoadSpec(min(spec.concurrency, 4), 1, min(spec.max_tokens, 8), spec.prompt_words, seed=1)
        asyncio.run(run_load(sut, warmup))
        row["loadavg_1m_before"] = os.getloadavg()[0]
        results, wall_s, row["client_cpu_s"] = asyncio.run(run_load(sut, spec))
        row["peak_rss_mib"] = sut.peak_rss_mib()
        row |= sut.stats()
    except Exception as exc:  # a broken system is a result, not the end of the benchmark
        results, wall_s = [RequestResult(error=f"{type(exc).__name__}: {exc}")], 0.0
    finally:
        sut.stop()
    return {**row, **summarize(results, wall_s)}, results


# ---------------------------------------------------------------- raw ceiling and model (subprocesses)


def ceiling_worker(model_dir: str, batch: int, threads: int, new_tokens: int, runs: int) -> dict[str, Any]:
    """Batched greedy decode with no server: prefill once, then one forward per new token."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, model.config.vocab_size, (batch, CEILING_PROMPT_TOKENS), generator=generator)  # (B, T)

    @torch.inference_mode()
    def generate() -> tuple[float, float]:
        start = time.perf_counter()
        out = model(input_ids=prompt, cache=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)
        next_ids = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        prefill_s = time.perf_counter() - start
        for _ in range(new_tokens - 1):
            out = model(input_ids=next_ids, cache=out.cache, use_cache=True)
            next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
        return time.perf_counter() - start, prefill_s

    generate()  # warmup
    timings = [generate() for _ in range(runs)]
    total_s, prefill_s = min(timings)
    return {
        "tokens_per_s": batch * new_tokens / total_s,
        "best_s": total_s,
        "all_s": [t for t, _ in timings],
        "prefill_s": prefill_s,
        "decode_step_ms": 1000 * (total_s - prefill_s) / max(new_tokens - 1, 1),
    }


def run_python(argv: list[str], what: str) -> str:
    """Run `python argv...` in the repo root; return its last stdout line. Keeps torch out of this process."""
    proc = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def run_ceiling(model_dir: Path, batch: int, threads: int, new_tokens: int) -> dict[str, Any]:
    params = {"model_dir": str(model_dir), "batch": batch, "threads": threads, "new_tokens": new_tokens, "runs": 2}
    out = run_python([str(Path(__file__).resolve()), "--ceiling-worker", json.dumps(params)], "the ceiling run")
    return dict(json.loads(out))


def ensure_model(size: str, cache_dir: Path) -> Path:
    code = "import sys; from pathlib import Path; from models.tiny import ensure_tiny; "
    code += "print(ensure_tiny(Path(sys.argv[1]), sys.argv[2]))"
    return Path(run_python(["-c", code, str(cache_dir), size], f"building the {size} model"))


# ---------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError, StopIteration):
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    torch_version = run_python(["-c", "import torch; print(torch.__version__)"], "importing torch")
    python = platform.python_version()
    return {"nproc": os.cpu_count(), "cpu": cpu, "torch": torch_version, "python": python, "loadavg": os.getloadavg()}


# (title, row key, scale): a scale multiplies the value and prints one decimal (1000: seconds as ms).
# fmt: off
COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("system", "system", None), ("concurrency", "concurrency", None), ("requests", "num_requests", None),
    ("tokens/s", "tokens_per_s", 1), ("vs ceiling", "vs_ceiling", None), ("req/s", "requests_per_s", 1),
    ("TTFT p50 ms", "ttft_p50_s", 1000), ("TTFT p99 ms", "ttft_p99_s", 1000),
    ("ITL p50 ms", "itl_p50_s", 1000), ("ITL p99 ms", "itl_p99_s", 1000),
    ("e2e p50 ms", "e2e_p50_s", 1000), ("e2e p99 ms", "e2e_p99_s", 1000),
    ("prompt tok", "mean_prompt_tokens", 1), ("errors", "num_errors", None), ("peak RSS MiB", "peak_rss_mib", 1),
)
# fmt: on


# The "vs stack off" section: ratios of each `--stack` mode over `off` at the same concurrency.
# fmt: off
VS_OFF_COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("system", "system", None), ("concurrency", "concurrency", None),
    ("tokens/s", "tokens_per_s", 1), ("tokens/s vs off", "vs_off_tokens_per_s", None),
    ("TTFT p50 ms", "ttft_p50_s", 1000), ("TTFT p50 vs off", "vs_off_ttft_p50", None),
    ("errors", "num_errors", None),
)
# fmt: on


def format_cell(value: Any, scale: int | None) -> str:
    if value is None:
        return "–"
    if scale is not None:
        return f"{value * scale:.1f}"
    return f"{value:.2f}x" if isinstance(value, float) else str(value)


def markdown_table(columns: tuple[tuple[str, str, int | None], ...], rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    return lines + [
        "| " + " | ".join(format_cell(row.get(key), scale) for _, key, scale in columns) + " |" for row in rows
    ]


def add_vs_off(rows: list[dict[str, Any]]) -> None:
    """Set each stack row's tokens/s and TTFT p50 as ratios over the `off` row at its concurrency."""
    off = {row["concurrency"]: row for row in rows if row.get("stack") == "off" and row.get("tokens_per_s")}
    for row in rows:
        base = off.get(row["concurrency"])
        if row.get("stack") is None or base is None or row.get("num_errors") == row.get("num_requests"):
            continue
        row["vs_off_tokens_per_s"] = row["tokens_per_s"] / base["tokens_per_s"]
        if row.get("ttft_p50_s") is not None and base.get("ttft_p50_s"):
            row["vs_off_ttft_p50"] = row["ttft_p50_s"] / base["ttft_p50_s"]


def render(rows: list[dict[str, Any]], machine: dict[str, Any], command: str, note: str) -> str:
    loadavg = " / ".join(f"{x:.2f}" for x in machine["loadavg"])
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {machine['nproc']} CPUs ({machine['cpu']}), torch {machine['torch']}, "
        f"python {machine['python']}, load average at start {loadavg}",
        "",
        note,
        "",
        *markdown_table(COLUMNS, rows),
    ]
    stack_rows = [row for row in rows if row.get("stack") is not None]
    if any("vs_off_tokens_per_s" in row for row in stack_rows):
        lines += [
            "",
            "### vs stack off",
            "",
            "Each mode over `off` at the same concurrency: tokens/s below 1.00x and TTFT above 1.00x are the "
            "traffic stack's cost. Modes ran one after another, each on a fresh server; single runs.",
            "",
            *markdown_table(VS_OFF_COLUMNS, stack_rows),
        ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", choices=("s", "m", "l"), default="m")
    parser.add_argument("--model-dir", type=Path, help="use this model directory instead of building a tiny one")
    parser.add_argument("--cache-dir", type=Path, default=REPO_ROOT / ".cache" / "bench-models")
    parser.add_argument("--concurrency", default="32", help="comma-separated list, e.g. 1,8,32")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per request (and for the ceiling)")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--prompt-words", type=int, default=DEFAULT_PROMPT_WORDS)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, for the server and the ceiling")
    parser.add_argument("--max-num-batched-tokens", type=int, help="passed to surge; default: the server's own")
    parser.add_argument("--surge-arg", action="append", default=[], help="extra `surge serve` argument (repeatable)")
    parser.add_argument(
        "--stack",
        help=f"comma-separated traffic-stack modes ({', '.join(STACK_MODES)}), one surge run each; "
        "default: one run at the server's defaults",
    )
    parser.add_argument("--no-ceiling", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench-results" / "bench.md")
    parser.add_argument("--smoke", action="store_true", help="seconds long: size s, concurrency 4, 8 tokens, 1 each")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model_size, args.concurrency, args.max_tokens, args.requests_per_client = "s", "4", 8, 1
    args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    if not args.concurrency or min(args.concurrency) < 1 or args.max_tokens < 1 or args.requests_per_client < 1:
        parser.error("--concurrency, --max-tokens and --requests-per-client must be positive")
    if args.stack is not None:
        names = [name.strip() for name in args.stack.split(",") if name.strip()]
        unknown = sorted(set(names) - set(STACK_MODES))
        if not names or unknown or len(set(names)) != len(names):
            parser.error(f"--stack takes distinct modes among {', '.join(STACK_MODES)}; got {args.stack!r}")
        args.stack = [STACK_MODES[name] for name in names]
    return args


def main(argv: list[str]) -> int:
    if argv[:1] == ["--ceiling-worker"]:
        print(json.dumps(ceiling_worker(**json.loads(argv[1]))))
        return 0
    args = parse_args(argv)
    command = shlex.join(sys.orig_argv)
    machine = machine_info()
    model_dir = args.model_dir.resolve() if args.model_dir else ensure_model(args.model_size, args.cache_dir)
    note = (
        f"Model `{model_dir.name}`; {args.max_tokens} new tokens per request, greedy, ignore_eos; "
        f"{args.requests_per_client} request(s) per client, closed loop; torch threads {args.threads}. "
        f"Ceiling: batch = concurrency, {CEILING_PROMPT_TOKENS}-token prompts, prefill + greedy decode loop, "
        "best of 2 after a warmup."
    )
    print(f"Command: {command}\nMachine: {machine}\nModel: {model_dir}", flush=True)
    rows: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    for concurrency in args.concurrency:
        ceiling = None
        if not args.no_ceiling:
            ceiling = run_ceiling(model_dir, concurrency, args.threads, args.max_tokens)
            rows.append({"system": "ceiling", "concurrency": concurrency, **ceiling})
            print(f"ceiling B={concurrency}: {ceiling['tokens_per_s']:.1f} tok/s", flush=True)
        spec = LoadSpec(concurrency, args.requests_per_client, args.max_tokens, args.prompt_words)
        stacks: list[StackMode | None] = args.stack or [None]
        for stack in stacks:
            sut = surge_server(model_dir, concurrency, args, stack)
            row, results = measure(sut, spec)
            if stack is not None:
                row["stack"] = stack.name
            if ceiling is not None and row["tokens_per_s"]:
                row["vs_ceiling"] = row["tokens_per_s"] / ceiling["tokens_per_s"]
            rows.append(row)
            raw.append({"system": sut.name, "concurrency": concurrency, "requests": [asdict(r) for r in results]})
            redis_note = f", {row['redis_commands']} redis commands" if "redis_commands" in row else ""
            print(
                f"{sut.name} c={concurrency}: {row['tokens_per_s']:.1f} tok/s, {row['num_errors']} errors{redis_note}",
                flush=True,
            )
            for error in row["errors"]:
                print(f"  error: {error}", file=sys.stderr)

    add_vs_off(rows)
    table = render(rows, machine, command, note)
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    report = {"command": command, "machine": machine, "model_dir": str(model_dir), "rows": rows, "raw": raw}
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return 1 if any(row.get("num_errors") for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
