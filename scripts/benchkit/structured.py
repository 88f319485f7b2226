"""Structured outputs under load (`python -m scripts.bench --structured`): what constrained decoding
costs a full batch, and whether a new schema holds up the streams already running.

One surge server; rounds interleave two closed-loop runs of `concurrency` streams:
- `plain`: no request constrained;
- `half json_schema`: every other request carries a `json_schema` (a few schemas in turn, so
  they are compiled once and cached, as agents' repeated schemas are).
Both run greedy to `max_tokens` (the schemas describe documents longer than that, and `ignore_eos`
holds the plain ones), with varied prompts, so tokens/s compare like for like. The ratio is the
median over rounds of mixed / plain. The grammar's own cost comes from surge's histograms: compile
time per new grammar and mask time per step with constrained rows.

Then the new-schema probe: `concurrency - 1` unconstrained streams run; after a calm window,
requests with schemas never seen before (each a few hundred properties: milliseconds to compile)
arrive one after another. The running streams' inter-token p99 during the arrivals against the
calm window's, in engine steps (the calm p50 gap is one step): compiling happens on the engine
process's pipe reader, off the step loop, so it should cost at most one step.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from scripts.benchkit.load import WORD_POOL, StatusError, sse_events
from scripts.benchkit.rawhttp import RawHttpClient, RawHttpError
from scripts.harness.stats import percentile

PATH = "/v1/chat/completions"
# Documents longer than any max_tokens the bench uses: an array of short records, at least 500.
RECORD = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["a", "b", "c"]},
    },
    "required": ["id", "name", "kind"],
    "additionalProperties": False,
}
SCHEMAS = [
    {
        "type": "object",
        "properties": {f"{key}": {"type": "array", "items": RECORD, "minItems": 500}},
        "required": [key],
        "additionalProperties": False,
    }
    for key in ("rows", "items", "records", "entries")
]
NEW_SCHEMA_PROPERTIES = 300
# The probe's running streams: long enough to outlast its windows (1.5 s and the arrivals) at a
# tiny model's fastest steps, short enough for its 2048-token context.
PROBE_TOKENS = 1900
WARM_S, CALM_S = 0.5, 1.0
PROBES = 3  # one probe's p99 is a handful of gaps: a stray pause anywhere moves it


@dataclass
class Stream:
    error: str | None = None
    times: list[float] = field(default_factory=list)  # perf_counter of each content chunk
    completion_tokens: int = 0


def response_format(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def new_schema(rng: random.Random) -> dict[str, Any]:
    """A schema no server has seen: many properties with random names."""
    names = [f"p{rng.getrandbits(40):x}" for _ in range(NEW_SCHEMA_PROPERTIES)]
    return {
        "type": "object",
        "properties": {name: {"type": "string", "maxLength": 4} for name in names},
        "required": names[:5],
        "additionalProperties": False,
    }


async def stream(client: RawHttpClient, body: dict[str, Any], result: Stream | None = None) -> Stream:
    """One streamed request; `result` fills as chunks arrive (so a cancelled stream keeps its times)."""
    result = result if result is not None else Stream()
    try:
        async for event in sse_events(client, PATH, body):
            if "error" in event:
                return Stream(error=f"stream error: {event['error']}")
            if event.get("usage"):
                result.completion_tokens = int(event["usage"]["completion_tokens"])
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    result.times.append(time.perf_counter())
    except StatusError as exc:
        return Stream(error=str(exc))
    except (RawHttpError, json.JSONDecodeError, TimeoutError) as exc:
        return Stream(error=f"{type(exc).__name__}: {exc}")
    return result


def chat_body(model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


async def closed_loop(
    base_url: str, model: str, concurrency: int, per_client: int, max_tokens: int, constrained: bool, seed: int
) -> tuple[list[Stream], float]:
    rng, words = random.Random(seed), WORD_POOL.split()
    client = RawHttpClient(base_url)
    await client.open_connections(concurrency)

    async def worker(index: int) -> list[Stream]:
        results = []
        for j in range(per_client):
            extra = {}
            # Alternating across workers and turns: half of the running batch is constrained at
            # every moment, not all of it in one half of the run.
            if constrained and (index + j) % 2:
                extra["response_format"] = response_format(SCHEMAS[(index + j) % len(SCHEMAS)], "doc")
            prompt = " ".join(rng.choices(words, k=8))
            results.append(await stream(client, chat_body(model, prompt, max_tokens, **extra)))
        return results

    start = time.perf_counter()
    try:
        per_worker = await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        await client.aclose()
    return [r for results in per_worker for r in results], time.perf_counter() - start


async def new_schema_probe(base_url: str, model: str, concurrency: int, num_new: int, seed: int) -> dict[str, Any]:
    """Inter-token gaps of running streams in a calm window and while new schemas arrive. The
    running streams are long (cut when the arrivals are over)."""
    rng, words = random.Random(seed), WORD_POOL.split()
    client = RawHttpClient(base_url)
    await client.open_connections(concurrency + 1)
    results = [Stream() for _ in range(concurrency - 1)]
    background = [
        asyncio.create_task(stream(client, chat_body(model, " ".join(rng.choices(words, k=8)), PROBE_TOKENS), result))
        for result in results
    ]
    try:
        await asyncio.sleep(WARM_S)  # every stream admitted and decoding
        calm_start = time.perf_counter()
        await asyncio.sleep(CALM_S)
        arrivals_start = time.perf_counter()
        for i in range(num_new):
            schema = new_schema(rng)
            body = chat_body(model, "a new kind of record", 8, response_format=response_format(schema, f"new{i}"))
            probe = await stream(client, body)
            if probe.error:
                raise RuntimeError(f"new-schema request failed: {probe.error}")
        arrivals_end = time.perf_counter()
        await asyncio.sleep(0.5)  # the gaps that end just after the last arrival
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await client.aclose()
    calm, during = [], []
    for result in results:
        for before, after in zip(result.times, result.times[1:], strict=False):
            if calm_start <= after < arrivals_start:
                calm.append(after - before)
            elif arrivals_start <= after < arrivals_end:
                during.append(after - before)
    step = statistics.median(calm) if calm else 0.0
    return {
        "calm_gaps": len(calm),
        "during_gaps": len(during),
        "step_ms": step * 1000,
        "calm_p99_ms": percentile(calm, 99) * 1000 if calm else None,
        "during_p99_ms": percentile(during, 99) * 1000 if during else None,
        "arrivals_s": arrivals_end - arrivals_start,
        "num_new_schemas": num_new,
    }


def histogram(metrics_text: str, name: str) -> tuple[float, float]:
    """(sum, count) of one of surge's histograms in a /metrics scrape."""
    total = count = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_sum{{"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count{{"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


@dataclass(frozen=True)
class StructuredSpec:
    concurrency: int
    per_client: int
    max_tokens: int
    rounds: int
    num_new_schemas: int = 4


def run(base_url: str, model: str, spec: StructuredSpec, log: Callable[[str], None]) -> dict[str, Any]:
    """The whole measurement against a running surge at `base_url`. The runs' schemas are compiled
    first (one short request each), as a server that has seen them before would have them."""
    for i, schema in enumerate(SCHEMAS):
        body = {**chat_body(model, "warm", 2, response_format=response_format(schema, "doc")), "stream": False}
        body.pop("stream_options")
        httpx.post(f"{base_url}{PATH}", json=body, timeout=60).raise_for_status()
        log(f"schema {i} compiled")
    rows: list[dict[str, Any]] = []
    for round_ in range(spec.rounds):
        for constrained in (False, True):
            before = httpx.get(f"{base_url}/metrics").text
            results, wall = asyncio.run(
                closed_loop(
                    # Prompts of their own per run: a greedy request repeated from an earlier run would be
                    # replayed by the dedup cache.
                    base_url,
                    model,
                    spec.concurrency,
                    spec.per_client,
                    spec.max_tokens,
                    constrained,
                    seed=2 * round_ + constrained,
                )
            )
            after = httpx.get(f"{base_url}/metrics").text
            errors = sorted({r.error for r in results if r.error})
            tokens = sum(r.completion_tokens for r in results if r.error is None)
            mask_after = histogram(after, "surge_grammar_mask_seconds")
            mask_before = histogram(before, "surge_grammar_mask_seconds")
            mask_sum, mask_count = mask_after[0] - mask_before[0], mask_after[1] - mask_before[1]
            row = {
                "round": round_,
                "load": "half json_schema" if constrained else "plain",
                "tokens_per_s": tokens / wall,
                "completion_tokens": tokens,
                "errors": errors,
                "mask_ms_per_step": mask_sum / mask_count * 1000 if mask_count else None,
                "masked_steps": mask_count,
            }
            rows.append(row)
            log(f"round {round_} {row['load']}: {row['tokens_per_s']:.1f} tok/s, {len(errors)} error kinds")
    ratios = [
        mixed["tokens_per_s"] / plain["tokens_per_s"]
        for plain, mixed in zip(rows[::2], rows[1::2], strict=True)
        if plain["tokens_per_s"]
    ]
    compile_sum, compile_count = histogram(httpx.get(f"{base_url}/metrics").text, "surge_grammar_compile_seconds")
    probes = []
    for i in range(PROBES):
        before = histogram(httpx.get(f"{base_url}/metrics").text, "surge_grammar_compile_seconds")
        probe = asyncio.run(new_schema_probe(base_url, model, spec.concurrency, spec.num_new_schemas, seed=99 + i))
        after = histogram(httpx.get(f"{base_url}/metrics").text, "surge_grammar_compile_seconds")
        new_compiles = after[1] - before[1]
        probe["new_schema_compile_ms"] = (after[0] - before[0]) / new_compiles * 1000 if new_compiles else None
        probes.append(probe)
        log(f"probe {i}: inter-token p99 calm {probe['calm_p99_ms']} ms, during arrivals {probe['during_p99_ms']} ms")
    return {
        "rows": rows,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ratios": ratios,
        "cached_schema_compile_ms": compile_sum / compile_count * 1000 if compile_count else None,
        "probes": probes,
    }


def _ms(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(report: dict[str, Any], spec: StructuredSpec, command: str, machine: dict[str, Any]) -> str:
    lines = [
        "## Structured outputs under load",
        "",
        f"Command: `{command}`",
        f"Machine: {machine}",
        f"{spec.concurrency} streams, {spec.per_client} requests each, {spec.max_tokens} tokens, greedy;"
        f" {spec.rounds} interleaved rounds.",
        "",
        "| round | load | tokens/s | mask ms per masked step | masked steps | errors |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['round']} | {row['load']} | {row['tokens_per_s']:.1f} | {_ms(row['mask_ms_per_step'], 3)} "
            f"| {row['masked_steps']:.0f} | {len(row['errors'])} |"
        )
    ratios = ", ".join(f"{r:.3f}" for r in report["ratios"])
    lines += [
        "",
        f"half json_schema / plain tokens/s: median {_ms(report['ratio_median'], 3)} (rounds: {ratios})",
        f"compile per grammar of the runs' schemas: {_ms(report['cached_schema_compile_ms'])} ms",
    ]
    lines += [
        "",
        f"New schemas ({NEW_SCHEMA_PROPERTIES} properties each) arriving one after another while"
        f" {spec.concurrency - 1} streams run; the running streams' inter-token p99, in a calm window and"
        " during the arrivals, and the difference in engine steps (the calm p50 gap):",
        "",
        "| probe | new schemas | compile ms each | step ms | p99 calm ms | p99 during ms | steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, probe in enumerate(report["probes"]):
        steps = "-"
        if probe["during_p99_ms"] is not None and probe["calm_p99_ms"] is not None and probe["step_ms"]:
            steps = f"{(probe['during_p99_ms'] - probe['calm_p99_ms']) / probe['step_ms']:+.2f}"
        lines.append(
            f"| {i} | {probe['num_new_schemas']} | {_ms(probe['new_schema_compile_ms'], 1)} | {_ms(probe['step_ms'])} "
            f"| {_ms(probe['calm_p99_ms'])} ({probe['calm_gaps']}) | {_ms(probe['during_p99_ms'])} "
            f"({probe['during_gaps']}) | {steps} |"
        )
    return "\n".join(lines) + "\n"
