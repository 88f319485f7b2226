"""A burst from many API keys: per-key limits hold, and one noisy key starves nobody.

    .venv/bin/python -m scripts.reliability.keys_burst           # full: 60 s
    .venv/bin/python -m scripts.reliability.keys_burst --fast    # seconds (tests/scripts)

A `--keys-file` of ten keys, each with its own limits:
- eight quiet keys, rpm 120-260, each sending Poisson arrivals at `quiet_rate` (1 req/s, about
  half of what its requests bucket refills): every request should succeed;
- one key bound by its tokens bucket (`tokens_tpm`), sending twice the quiet rate;
- one noisy key, rpm `noisy_rpm`, sending 20x the quiet rate: its bucket empties at once.
A bucket holds one minute's worth and refills at limit / 60 per second (docs/traffic.md, "Rate limits"),
so over a window of W seconds a key can have at most limit x (1 + W / 60) requests (or tokens,
prompt + completion, as usage reports them) succeed.

Criteria: no key above that; the quiet keys' success rate >= 98% with no 429; the noisy and the
tokens-bound keys got 429s of their bucket's type and at least 80% of what their limit allows
(the limit is not stricter than promised); no error but 429.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from scripts.harness.chat import ChatAttempt, send_chat
from scripts.harness.procs import load_average, machine_line
from scripts.harness.servers import surge_server
from scripts.loadtest.workload import WORD_POOL, poisson_arrivals
from scripts.reliability.common import (
    NO_DRAIN_ARGS,
    Criterion,
    all_passed,
    chat_body,
    render_report,
    write_report,
)

# Margin on a key's window: the server decides a moment after the client starts a request.
WINDOW_MARGIN_S = 1.0


@dataclass(frozen=True, slots=True)
class KeySpec:
    key: str
    kind: str  # quiet, tokens, noisy
    rate: float  # requests/s sent
    rpm: int
    tpm: int = 0  # 0: no tokens limit


@dataclass(frozen=True, slots=True)
class BurstConfig:
    model: str = "tiny"
    duration_s: float = 60.0
    quiet_rate: float = 1.0
    noisy_factor: float = 20.0
    noisy_rpm: int = 60
    tokens_tpm: int = 1200  # ~25 requests of ~48 tokens; binds at 2 req/s
    prompt_words: int = 8
    max_tokens: int = 16
    seed: int = 0
    min_quiet_success: float = 0.98
    min_allowance_used: float = 0.8

    def key_specs(self) -> list[KeySpec]:
        quiet = [KeySpec(f"sk-quiet-{i}", "quiet", self.quiet_rate, rpm=120 + 20 * i) for i in range(8)]
        tokens = KeySpec("sk-tokens-8", "tokens", 2 * self.quiet_rate, rpm=600, tpm=self.tokens_tpm)
        noisy = KeySpec("sk-noisy-9", "noisy", self.noisy_factor * self.quiet_rate, rpm=self.noisy_rpm)
        return [*quiet, tokens, noisy]


FAST = BurstConfig(duration_s=10.0, tokens_tpm=300)


@dataclass
class KeyOutcome:
    spec: KeySpec
    attempts: list[ChatAttempt] = field(default_factory=list)

    @property
    def ok(self) -> list[ChatAttempt]:
        return [a for a in self.attempts if a.is_ok]

    @property
    def window_s(self) -> float:
        starts = [a.start_s for a in self.attempts]
        return (max(starts) - min(starts) + WINDOW_MARGIN_S) if starts else 0.0

    def allowance(self, limit: int) -> float:
        return limit * (1 + self.window_s / 60)

    @property
    def tokens(self) -> int:
        return sum(a.prompt_tokens + a.completion_tokens for a in self.ok)

    def refused(self, bucket: str) -> int:
        return sum(1 for a in self.attempts if a.status == 429 and f'"type":"{bucket}"' in a.detail.replace(" ", ""))


def write_keys_file(config: BurstConfig, directory: Path) -> Path:
    path = directory / "keys.json"
    entries: dict[str, dict[str, int]] = {}
    for spec in config.key_specs():
        entries[spec.key] = {"rpm": spec.rpm, **({"tpm": spec.tpm} if spec.tpm else {})}
    path.write_text(json.dumps(entries, indent=2))
    return path


async def drive(config: BurstConfig, api: str, model: str) -> list[KeyOutcome]:
    run_id = uuid.uuid4().hex[:8]
    outcomes = [KeyOutcome(spec) for spec in config.key_specs()]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:
        t0 = time.perf_counter()

        async def one_key(index: int, outcome: KeyOutcome) -> None:
            rng = random.Random(config.seed * 100 + index)
            headers = {"Authorization": f"Bearer {outcome.spec.key}"}
            tasks = []
            for serial, offset in enumerate(
                poisson_arrivals(outcome.spec.rate, config.duration_s, rng.randrange(1 << 30))
            ):
                await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
                prompt = " ".join([f"{run_id}-{index}-{serial}:", *rng.choices(WORD_POOL, k=config.prompt_words)])
                body = chat_body(model, prompt, config.max_tokens, is_streaming=False)
                tasks.append(
                    asyncio.create_task(send_chat(client, f"{api}/chat/completions", body, t0=t0, headers=headers))
                )
            outcome.attempts = list(await asyncio.gather(*tasks))

        await asyncio.gather(*(one_key(i, outcome) for i, outcome in enumerate(outcomes)))
    return outcomes


def evaluate(config: BurstConfig, outcomes: list[KeyOutcome]) -> list[Criterion]:
    over, starved, under_used, other = [], [], [], []
    for outcome in outcomes:
        spec = outcome.spec
        if len(outcome.ok) > outcome.allowance(spec.rpm):
            over.append(f"{spec.key}: {len(outcome.ok)} > {outcome.allowance(spec.rpm):.0f} requests")
        if spec.tpm and outcome.tokens > outcome.allowance(spec.tpm):
            over.append(f"{spec.key}: {outcome.tokens} > {outcome.allowance(spec.tpm):.0f} tokens")
        other += [f"{spec.key}: {a.error} {a.detail[:80]}" for a in outcome.attempts if a.error not in (None, "429")]
        if spec.kind == "quiet":
            rate = len(outcome.ok) / len(outcome.attempts) if outcome.attempts else 0.0
            if rate < config.min_quiet_success or outcome.refused("requests") or outcome.refused("tokens"):
                starved.append(f"{spec.key}: {len(outcome.ok)}/{len(outcome.attempts)}")
        else:
            bucket, limit = ("tokens", spec.tpm) if spec.kind == "tokens" else ("requests", spec.rpm)
            used = outcome.tokens if spec.kind == "tokens" else len(outcome.ok)
            refused, allowance = outcome.refused(bucket), outcome.allowance(limit)
            if not refused or used < config.min_allowance_used * allowance:
                under_used.append(f"{spec.key}: {used} of {allowance:.0f} {bucket}, {refused} 429s")
    quiet = [o for o in outcomes if o.spec.kind == "quiet"]
    quiet_ok, quiet_sent = sum(len(o.ok) for o in quiet), sum(len(o.attempts) for o in quiet)
    noisy = next(o for o in outcomes if o.spec.kind == "noisy")
    return [
        Criterion(
            "no key above its limit + burst",
            "successes <= limit x (1 + window / 60 s), requests and tokens",
            "; ".join(over) or f"all {len(outcomes)} keys within",
            not over,
        ),
        Criterion(
            "quiet keys not starved by the noisy one",
            f">= {config.min_quiet_success:.0%} success each, no 429",
            "; ".join(starved) or f"{quiet_ok}/{quiet_sent} succeeded ({quiet_ok / max(1, quiet_sent):.1%})",
            not starved and quiet_sent > 0,
        ),
        Criterion(
            "limited keys get what their limit allows",
            f"429s of their bucket's type and >= {config.min_allowance_used:.0%} of the allowance",
            "; ".join(under_used)
            or f"noisy {len(noisy.ok)} of {noisy.allowance(noisy.spec.rpm):.0f} allowed ({len(noisy.attempts)} sent)",
            not under_used,
        ),
        Criterion("no error but 429", "none", "; ".join(other[:5]) or "none", not other),
    ]


def render(config: BurstConfig, outcomes: list[KeyOutcome], criteria: list[Criterion], context: list[str]) -> str:
    table = [
        "| key | kind | rpm | tpm | sent/s | sent | ok | 429 requests | 429 tokens | ok/window | allowed (req) "
        "| tokens ok | allowed (tok) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        s = o.spec
        table.append(
            f"| {s.key} | {s.kind} | {s.rpm} | {s.tpm or '–'} | {s.rate:g} | {len(o.attempts)} | {len(o.ok)} | "
            f"{o.refused('requests')} | {o.refused('tokens')} | {o.window_s:.1f} s | {o.allowance(s.rpm):.0f} | "
            f"{o.tokens} | {f'{o.allowance(s.tpm):.0f}' if s.tpm else '–'} |"
        )
    return render_report("Keys burst", context, criteria, ["\n".join(table)])


async def run_burst(config: BurstConfig, directory: Path) -> tuple[list[KeyOutcome], list[str]]:
    keys_file = write_keys_file(config, directory)
    averages = [load_average()]
    args = ["--keys-file", str(keys_file), *NO_DRAIN_ARGS]
    with surge_server(config.model, directory / "server.log", *args) as server:
        model = await served_model_with_key(server.url, config.key_specs()[0].key)
        outcomes = await drive(config, server.api, model)
    averages.append(load_average())
    context = [
        f"Machine: {machine_line()}; load average (1/5/15 min) {' -> '.join(averages)}.",
        f"Server: `surge serve --model {config.model} --keys-file keys.json` (file: {keys_file}).",
        f"Requests: JSON chat, {config.prompt_words}-word prompts (~32 tokens), max_tokens {config.max_tokens}, "
        f"Poisson arrivals per key for {config.duration_s:g} s; the noisy key sends {config.noisy_factor:g}x a "
        "quiet key's rate.",
    ]
    return outcomes, context


async def served_model_with_key(base_url: str, key: str) -> str:
    async with httpx.AsyncClient(timeout=10.0, headers={"Authorization": f"Bearer {key}"}) as client:
        response = await client.get(f"{base_url}/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="the seconds-long version (tests)")
    parser.add_argument("--model", default="tiny", help="surge serve --model (default: tiny)")
    parser.add_argument("--duration", type=float, help="seconds of load")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--dir", type=Path, help="keys file and server log (default: a temp dir)")
    args = parser.parse_args(argv)
    config = replace(FAST if args.fast else BurstConfig(), model=args.model)
    if args.duration is not None:
        config = replace(config, duration_s=args.duration)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="surge-keys-burst-"))
    directory.mkdir(parents=True, exist_ok=True)
    outcomes, context = asyncio.run(run_burst(config, directory))
    criteria = evaluate(config, outcomes)
    command = "python -m scripts.reliability.keys_burst " + " ".join(sys.argv[1:] if argv is None else argv)
    write_report(render(config, outcomes, criteria, [f"Command: `{command.strip()}`", *context]), args.out)
    return 0 if all_passed(criteria) else 1


if __name__ == "__main__":
    raise SystemExit(main())
