"""What the load tester sends: prompts and output lengths drawn from ranges, duplicates, arrival times.

Pure and seeded: the same `WorkloadSpec` gives the same requests, in the same order, every run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Common English words: the tiny model's BPE turns each into one or two tokens.
WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line"
)
WORD_POOL = WORD_TEXT.split()


@dataclass(frozen=True, slots=True)
class IntRange:
    """Inclusive bounds; a value is drawn uniformly from them."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise ValueError(f"need 1 <= low <= high, got {self.low}:{self.high}")

    @classmethod
    def parse(cls, text: str) -> IntRange:
        """`"32"` (fixed) or `"16:128"` (uniform between, both included)."""
        low, _, high = text.partition(":")
        try:
            return cls(int(low), int(high or low))
        except ValueError as exc:
            raise ValueError(f"expected N or LOW:HIGH with positive integers, got {text!r}") from exc

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    prompt_words: IntRange
    max_tokens: IntRange
    # Share of requests that repeat an earlier request exactly (prompt and max_tokens): with
    # temperature 0 they are what a dedup cache serves without running the model.
    duplicate_fraction: float = 0.0
    seed: int = 0
    # Starts every prompt. The CLI draws a fresh one per run: with a fixed seed, a second run's
    # prompts would otherwise equal the first's, and a dedup cache would answer them all.
    run_id: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.duplicate_fraction <= 1.0:
            raise ValueError("duplicate_fraction must be between 0 and 1")


@dataclass(frozen=True, slots=True)
class RequestPlan:
    prompt: str
    max_tokens: int
    is_duplicate: bool = False


class Workload:
    """An endless, seeded stream of request plans."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self._originals: list[RequestPlan] = []

    def next_plan(self) -> RequestPlan:
        rng = self._rng
        if self._originals and rng.random() < self.spec.duplicate_fraction:
            original = rng.choice(self._originals)
            return RequestPlan(original.prompt, original.max_tokens, is_duplicate=True)
        # The run id and a serial number keep every original distinct, whatever the words drawn.
        words = rng.choices(WORD_POOL, k=self.spec.prompt_words.draw(rng))
        prefix = f"{self.spec.run_id}-{len(self._originals)}:"
        plan = RequestPlan(" ".join([prefix, *words]), self.spec.max_tokens.draw(rng))
        self._originals.append(plan)
        return plan


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Arrival offsets in [0, duration_s) with exponential gaps of mean 1/rate (a Poisson process)."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng, t = random.Random(seed), 0.0
    offsets: list[float] = []
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return offsets
        offsets.append(t)
