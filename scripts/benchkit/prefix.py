"""Prefix-caching workloads (`python -m scripts.bench --workload ...`, issue 18): the prompts, the
load they make and its summary. Knows a system under test only as load.py does.

- `shared-prefix`: one system prompt of about `prefix_tokens` tokens, the same for every request of
  the run, and a short user turn that starts with a random tag; `concurrency` closed-loop streams,
  `requests_per_client` requests each. The shared prompt is sent once before the clock runs, as on a
  server that has served it before: otherwise the first burst arrives together and misses together.
- `multi-turn`: `concurrency` conversations side by side, `num_turns` turns each; a turn sends the
  whole history (system, then each user turn with the reply it got as the assistant message) and a
  new user turn. Each conversation's system prompt starts with its own tag, so turn 1 is a cold
  prefill and turns 2+ can reuse only their own conversation's history.
- `no-shared`: the lengths of `shared-prefix`, but the tag opens the system prompt, so every prompt
  differs from its first token (after the chat template's opening): what a cache costs at a 0% hit
  rate. Timed on a server that has served the workload once before (untimed, other tags), as one
  that has been up for a minute has: a fresh server's first pass also pays for the memory it
  touches for the first time (the slot cache growing, the prefix cache's pool filling), a cost
  paid once; that pass's tokens/s is reported beside it (`first_pass_tokens_per_s`).

Tags keep every request unique: surge's dedup cache replays identical greedy requests.
The hit rate is sum(usage.prompt_tokens_details.cached_tokens) / sum(usage.prompt_tokens); a server
that does not report the details (llama-server reports `timings` instead) has an unknown one.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scripts.benchkit.load import (
    DEFAULT_PROMPT_WORDS,
    WORD_POOL,
    LoadSpec,
    SystemUnderTest,
    count,
    run_load,
    stream_chat,
)
from scripts.benchkit.prefix_responses import chains
from scripts.benchkit.rawhttp import RawHttpClient
from scripts.benchkit.turns import TurnResult
from scripts.harness.stats import percentile

WORKLOADS = ("shared-prefix", "multi-turn", "no-shared", "responses-chain")
# Streams (shared-prefix, no-shared) or conversations (multi-turn) when --concurrency is not given.
DEFAULT_CONCURRENCY = {"shared-prefix": 32, "multi-turn": 16, "no-shared": 32, "responses-chain": 16}
DEFAULT_PREFIX_TOKENS = 1000
NUM_TURNS = 4
USER_WORDS = 8  # a user turn: a tag and 8 words, about 35 tokens with the tiny tokenizer
PATH = "/v1/chat/completions"
WORDS = WORD_POOL.split()

Message = dict[str, str]


@dataclass(frozen=True)
class WorkloadSpec:
    workload: str
    concurrency: int  # streams, or conversations for multi-turn
    requests_per_client: int  # back to back per stream (not multi-turn: a conversation has num_turns)
    max_tokens: int
    system_prompt: str  # about prefix_tokens tokens of text, tag-free
    num_turns: int = NUM_TURNS
    seed: int = 0
    # Stream i starts i x this late. Started together, a closed loop's streams stay in step with
    # the cache on (each burst of 32 gets its first tokens together) and fall apart without it
    # (cold prefills queue, later requests arrive alone), so TTFT p50 compared unlike arrivals.
    stagger_s: float = 0.05

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; expected one of {', '.join(WORKLOADS)}")
        if min(self.concurrency, self.requests_per_client, self.max_tokens, self.num_turns) < 1:
            raise ValueError("concurrency, requests_per_client, max_tokens and num_turns must be positive")

    @property
    def is_conversation(self) -> bool:
        return self.workload in ("multi-turn", "responses-chain")

    @property
    def num_requests(self) -> int:
        per_client = self.num_turns if self.is_conversation else self.requests_per_client
        return self.concurrency * per_client


def parse_workloads(text: str) -> list[str]:
    """`--workload`: `default` (none of these: []) or distinct names of WORKLOADS, comma-separated."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["default"]:
        return []
    if not names or set(names) - set(WORKLOADS) or len(set(names)) < len(names):
        raise ValueError(f"--workload takes `default` or distinct names among {', '.join(WORKLOADS)}; got {text!r}")
    return names


# ---------------------------------------------------------------- prompts (pure)


def token_counter(model_dir: Path) -> Callable[[str], int]:
    """Tokens of a text with the model's tokenizer (no special tokens, no template): `tokenizers`
    on its tokenizer.json, which keeps torch out of this process, else `transformers.AutoTokenizer`."""
    if (model_dir / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        return lambda text: len(fast.encode(text, add_special_tokens=False).ids)
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(model_dir)
    return lambda text: len(auto.encode(text, add_special_tokens=False))


def fit_text(count_tokens: Callable[[str], int], num_tokens: int, rng: random.Random) -> str:
    """Random words whose token count is the closest to `num_tokens`: the shortest run of words that
    reaches it, or one word fewer when that is closer (a binary search over the number of words)."""
    if num_tokens < 1:
        raise ValueError("num_tokens must be positive")
    words: list[str] = []
    while count_tokens(" ".join(words)) < num_tokens:
        words += rng.choices(WORDS, k=max(num_tokens // 2, 8))
    low, high = 0, len(words)  # count(words[:low]) < num_tokens <= count(words[:high])
    while high - low > 1:
        mid = (low + high) // 2
        if count_tokens(" ".join(words[:mid])) < num_tokens:
            low = mid
        else:
            high = mid
    best = min((high, low), key=lambda n: abs(count_tokens(" ".join(words[:n])) - num_tokens))
    return " ".join(words[:best])


def new_tag(rng: random.Random, used: set[str]) -> str:
    """12 random hex digits, none used before in `used`."""
    while (tag := f"{rng.getrandbits(48):012x}") in used:
        pass
    used.add(tag)
    return tag


def user_text(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=USER_WORDS))


def single_turn_messages(workload: str, system_prompt: str, count: int, seed: int) -> list[list[Message]]:
    """`count` distinct requests of `shared-prefix` (the system prompt as it is, the tag opening the
    user turn) or `no-shared` (the tag opening the system prompt): one tag each, the same lengths."""
    if workload not in ("shared-prefix", "no-shared"):
        raise ValueError(f"{workload!r} is not a single-turn workload")
    rng, used = random.Random(seed), set[str]()
    requests = []
    for _ in range(count):
        tag = new_tag(rng, used)
        if workload == "shared-prefix":
            system, user = system_prompt, f"{tag} {user_text(rng)}"
        else:
            system, user = f"{tag} {system_prompt}", user_text(rng)
        requests.append([{"role": "system", "content": system}, {"role": "user", "content": user}])
    return requests


@dataclass(frozen=True)
class Conversation:
    system: Message  # opens with the conversation's own tag
    user_turns: tuple[Message, ...]

    def messages(self, turn: int, replies: list[str]) -> list[Message]:
        """Turn `turn` (0-based) given the replies to the turns before it: the system prompt, each
        earlier user turn followed by its reply as the assistant's message, this turn's user turn."""
        if len(replies) != turn:
            raise ValueError(f"turn {turn} needs the {turn} replies before it, not {len(replies)}")
        history = [self.system]
        for user, reply in zip(self.user_turns, replies, strict=False):
            history += [user, {"role": "assistant", "content": reply}]
        return [*history, self.user_turns[turn]]


def conversations(system_prompt: str, count: int, num_turns: int, seed: int) -> list[Conversation]:
    rng, used = random.Random(seed), set[str]()
    return [
        Conversation(
            {"role": "system", "content": f"{new_tag(rng, used)} {system_prompt}"},
            tuple({"role": "user", "content": f"{new_tag(rng, used)} {user_text(rng)}"} for _ in range(num_turns)),
        )
        for _ in range(count)
    ]


# ---------------------------------------------------------------- load


async def stream_turn(client: RawHttpClient, body: dict[str, Any], headers: dict[str, str]) -> TurnResult:
    r = await stream_chat(client, PATH, body, headers)
    return TurnResult(1, r.error, r.ttft_s, r.e2e_s, r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.text)


async def run_workload(
    sut: SystemUnderTest, spec: WorkloadSpec, on_done: Callable[[], None] | None = None
) -> tuple[list[TurnResult], float, float]:
    """The workload's requests; returns (results, wall seconds, CPU seconds of this client)."""
    body = {"model": sut.model_name, "max_tokens": spec.max_tokens, "temperature": 0, "stream": True}
    body |= {"stream_options": {"include_usage": True}, **sut.request_extras}
    client = RawHttpClient(sut.base_url)

    async def send(messages: list[Message], turn: int) -> TurnResult:
        result = await stream_turn(client, {**body, "messages": messages}, sut.request_headers())
        result.turn = turn
        if on_done is not None:
            on_done()
        return result

    async def converse(index: int, conversation: Conversation) -> list[TurnResult]:
        await asyncio.sleep(index * spec.stagger_s)
        results: list[TurnResult] = []
        for turn in range(spec.num_turns):
            results.append(await send(conversation.messages(turn, [r.text for r in results]), turn + 1))
            if results[-1].error is not None:
                skipped = range(turn + 2, spec.num_turns + 1)
                return results + [TurnResult(turn=t, error="skipped: an earlier turn failed") for t in skipped]
        return results

    try:
        await client.open_connections(spec.concurrency)
        per_client = spec.requests_per_client
        if spec.is_conversation:
            talks = conversations(spec.system_prompt, spec.concurrency, spec.num_turns, spec.seed)
            if spec.workload == "responses-chain":  # the same conversations, the server keeping them
                texts = [(c.system["content"], [u["content"] for u in c.user_turns]) for c in talks]
                work = chains(sut, client, texts, spec.max_tokens, spec.stagger_s, on_done)
            else:
                work = [converse(i, c) for i, c in enumerate(talks)]
        else:
            prompts = single_turn_messages(spec.workload, spec.system_prompt, spec.num_requests + 1, spec.seed)
            if spec.workload == "shared-prefix":
                await stream_turn(client, {**body, "messages": prompts[-1]}, sut.request_headers())  # see above

            async def stream(index: int) -> list[TurnResult]:
                await asyncio.sleep(index * spec.stagger_s)
                return [await send(m, 1) for m in prompts[index * per_client : (index + 1) * per_client]]

            work = [stream(i) for i in range(spec.concurrency)]
        cpu_start, start = time.process_time(), time.perf_counter()
        per_worker = await asyncio.gather(*work)
        wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        await client.aclose()
    return [r for results in per_worker for r in results], wall_s, cpu_s


async def timed_workload(
    sut: SystemUnderTest, spec: WorkloadSpec, on_done: Callable[[], None] | None = None
) -> tuple[float | None, tuple[list[TurnResult], float, float]]:
    """(the first pass's tokens/s, run_workload's answer for the timed pass): no-shared runs a
    whole untimed pass first, with other tags (the module's docstring); the others have no first
    pass (None)."""
    return await untimed_pass(sut, spec), await run_workload(sut, spec, on_done)


async def untimed_pass(sut: SystemUnderTest, spec: WorkloadSpec) -> float | None:
    """no-shared: a whole pass with other tags before the clock runs; its tokens/s. Others: None."""
    if spec.workload != "no-shared":
        return None
    results, wall_s, _ = await run_workload(sut, replace(spec, seed=spec.seed + 1))
    tokens_per_s: float = count(results, wall_s)["tokens_per_s"]
    return tokens_per_s


def warm_up(sut: SystemUnderTest, spec: WorkloadSpec) -> None:
    """Short prompts first, as the closed loops' (scripts/benchkit/load.py)."""
    asyncio.run(
        run_load(sut, LoadSpec(min(spec.concurrency, 4), 1, min(spec.max_tokens, 8), DEFAULT_PROMPT_WORDS, seed=1))
    )


def measure(
    sut: SystemUnderTest, spec: WorkloadSpec, on_done: Callable[[], None] | None = None
) -> tuple[dict[str, Any], list[TurnResult]]:
    """Start `sut`, warm it up (short prompts, as the closed loops'; no-shared: a whole untimed pass
    first), run the workload, stop it. A failed start counts as one failed request."""
    row: dict[str, Any] = {"workload": spec.workload, "system": sut.name, "concurrency": spec.concurrency}
    try:
        sut.start()
        warm_up(sut, spec)
        row["first_pass_tokens_per_s"], (results, wall_s, row["client_cpu_s"]) = asyncio.run(
            timed_workload(sut, spec, on_done)
        )
        row["peak_rss_mib"] = sut.peak_rss_mib()
    except Exception as exc:  # a broken system is a result, not the end of the benchmark
        results, wall_s = [TurnResult(error=f"{type(exc).__name__}: {exc}")], 0.0
    finally:
        sut.stop()
    return row | summarize(results, wall_s), results


def measure_side_by_side(
    suts: list[SystemUnderTest], spec: WorkloadSpec, passes: int, on_done: Callable[[], None] | None = None
) -> list[tuple[dict[str, Any], list[TurnResult]]]:
    """Every system started once and kept up, warmed up as `measure` does, then `passes` timed
    passes each, taken in turn (every other pass in reverse order), each with prompts of its own:
    adjacent passes on the same servers, so neither a fresh process's first touches of memory nor
    the machine's drift from minute to minute falls on one side. Rows carry the pass as their
    round; a system that fails to start counts as one failed request and sits out."""
    measured: list[tuple[dict[str, Any], list[TurnResult]]] = []
    live: list[SystemUnderTest] = []
    first_pass: dict[str, float | None] = {}
    base = {"workload": spec.workload, "concurrency": spec.concurrency}
    try:
        for sut in suts:
            try:
                sut.start()
                live.append(sut)
                warm_up(sut, spec)
                first_pass[sut.name] = asyncio.run(untimed_pass(sut, spec))
            except Exception as exc:
                failed = [TurnResult(error=f"{type(exc).__name__}: {exc}")]
                measured.append((base | {"system": sut.name, "round": 0} | summarize(failed, 0.0), failed))
                if sut in live:
                    live.remove(sut)
                    sut.stop()
        for pass_ in range(passes):
            for sut in live if pass_ % 2 == 0 else live[::-1]:
                timed = replace(spec, seed=spec.seed + 2 + pass_)  # prompts no earlier pass sent
                results, wall_s, cpu_s = asyncio.run(run_workload(sut, timed, on_done))
                row = base | {"system": sut.name, "round": pass_, "client_cpu_s": cpu_s}
                if pass_ == 0:
                    row["first_pass_tokens_per_s"] = first_pass.get(sut.name)
                if pass_ == passes - 1:
                    row["peak_rss_mib"] = sut.peak_rss_mib()
                measured.append((row | summarize(results, wall_s), results))
    finally:
        for sut in live:
            sut.stop()
    return measured


# ---------------------------------------------------------------- summary


def hit_rate(results: list[TurnResult]) -> float | None:
    """Cached over prompt tokens of `results`; None (unknown) unless every one reported both."""
    if not results or any(r.cached_tokens is None or r.prompt_tokens is None for r in results):
        return None
    num_prompt = sum(r.prompt_tokens or 0 for r in results)
    return sum(r.cached_tokens or 0 for r in results) / num_prompt if num_prompt else None


def summarize(results: list[TurnResult], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    summary = count(results, wall_s) | {"cache_hit_rate": hit_rate(ok)}
    groups = {"": ok}
    if any(r.turn > 1 for r in results):  # multi-turn: turn 1 (cold) apart from the turns after it
        groups |= {"_first": [r for r in ok if r.turn == 1], "_later": [r for r in ok if r.turn > 1]}
    for suffix, members in groups.items():
        for q in (50, 99):
            summary[f"ttft_p{q}{suffix}_s"] = percentile([r.ttft_s for r in members if r.ttft_s is not None], q)
    return summary


def combine_rounds(measured: list[tuple[dict[str, Any], list[TurnResult]]]) -> list[dict[str, Any]]:
    """One row per workload and system from its rounds: tokens/s (and no-shared's first pass) the
    median of the rounds' (each round's in `<key>_rounds`), latency percentiles and the hit rate
    over every round's requests pooled, the largest peak RSS."""
    groups: dict[tuple[str, str], list[tuple[dict[str, Any], list[TurnResult]]]] = {}
    for row, results in measured:
        groups.setdefault((row["workload"], row["system"]), []).append((row, results))
    combined = []
    for members in groups.values():
        rows = [row for row, _ in members]
        row = rows[-1] | summarize([r for _, results in members for r in results], sum(m["wall_s"] for m in rows))
        in_order = sorted(rows, key=lambda m: m.get("round", 0))
        for key in ("tokens_per_s", "first_pass_tokens_per_s"):
            values = [m[key] for m in in_order if m.get(key) is not None]
            row[key] = statistics.median(values) if values else None
            row[f"{key}_rounds"] = values
        # Each round's own latency and hit rate beside the pooled ones: a target on TTFT is judged
        # in every round, and the spread between rounds says how far one run can be trusted.
        for key in ("ttft_p50_s", "ttft_p50_later_s", "cache_hit_rate"):
            row[f"{key}_rounds"] = [m.get(key) for m in in_order]
        rss = [m["peak_rss_mib"] for m in rows if m.get("peak_rss_mib") is not None]
        row["peak_rss_mib"] = max(rss) if rss else None
        row["rounds"] = len(rows)
        row.pop("round", None)
        combined.append(row)
    return combined
