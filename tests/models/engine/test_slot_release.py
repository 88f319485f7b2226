"""When free slots' K/V memory goes back (models/engine/slot_release.py): the policy on a recording
runner and a hand-driven clock; then the real engine, whose idle release must not lose a
finished sequence's prefix-cache copy (a cached prefix read back as zeros would change tokens)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from models.engine.slot_release import SlotRelease
from models.process.async_engine import AsyncEngine
from models.sampling.params import SamplingParams
from models.scheduler.output import SlotMove
from models.scheduler.sequence import Sequence
from tests.models.engine.test_core import run, tokens as ids, wait_until
from tests.models.engine.test_prefix import greedy, start, submit_round


class Recorder:
    def __init__(self) -> None:
        self.released: list[tuple[int, int]] = []
        self.tails: list[tuple[int, int]] = []

    def release_slots(self, first_slot: int, end_slot: int) -> None:
        self.released.append((first_slot, end_slot))

    def release_tail(self, slot: int, first_position: int) -> None:
        self.tails.append((slot, first_position))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def policy(num_slots: int = 8, at_once: bool = False) -> tuple[SlotRelease, Recorder, Clock]:
    runner, clock = Recorder(), Clock()
    slots = SlotRelease(runner, num_slots, clock, busy_interval_s=10.0, idle_delay_s=1.0, at_once=at_once)  # type: ignore[arg-type]
    return slots, runner, clock


def running(*lengths: int) -> list[Sequence]:
    """The scheduler's running list: slot i holds a sequence of lengths[i] computed tokens."""
    seqs = []
    for slot, length in enumerate(lengths):
        seq = Sequence(f"r{slot}", [5] * max(length, 1), SamplingParams(max_tokens=8))
        seq.slot, seq.num_computed_tokens = slot, length
        seqs.append(seq)
    return seqs


def test_a_fresh_cache_counts_every_slot_until_the_first_release() -> None:
    # warmup writes every slot: all of them may hold memory until released
    slots, runner, _ = policy(8)
    assert slots.idle_wait() == 1.0
    slots.idle()
    assert runner.released == [(0, 8)]
    assert slots.idle_wait() is None  # nothing left to release: the idle engine blocks for good


def test_a_busy_batch_releases_what_it_left_at_most_once_an_interval() -> None:
    slots, runner, clock = policy(8)
    slots.idle()
    runner.released.clear()
    for num_slots in (2, 6, 5, 3):  # the batch grows to 6, then shrinks within the interval
        slots.after_moves([], running(*[10] * num_slots))
        clock.now += 1.0
    assert runner.released == []
    clock.now += 10.0
    slots.after_moves([], running(10, 10, 10))
    assert runner.released == [(3, 6)]  # up to the highest slot used since the last release
    slots.after_moves([SlotMove(2, 1, 10)], running(10, 10))
    assert runner.released == [(3, 6)]  # the next waits for its interval; no tails without at_once
    slots.after_moves([], running(*[10] * 4))
    clock.now += 10.0
    slots.after_moves([], running(10))
    assert runner.released == [(3, 6), (1, 4)]


def test_a_batch_that_stays_full_releases_nothing() -> None:
    slots, runner, clock = policy(4)
    for _ in range(5):
        clock.now += 20.0
        slots.after_moves([], running(9, 9, 9, 9))
    assert runner.released == []


def test_at_once_releases_free_slots_and_the_tails_of_slots_moved_into_every_step() -> None:
    # Where the budget counts tokens: the memory held must stay what the running sequences hold.
    slots, runner, _ = policy(8, at_once=True)
    slots.idle()
    runner.released.clear()
    slots.after_moves([], running(40, 70, 30, 50))
    assert runner.released == [] and runner.tails == []
    # The sequence in slot 1 finished; the last (slot 3, 50 tokens) moved into its place. Then a
    # sequence of slot 0 finished and slot 2's moved there: both tails go, and slots 2-3 at once.
    slots.after_moves([SlotMove(3, 1, 50), SlotMove(2, 0, 30)], running(30, 50))
    assert runner.tails == [(0, 30), (1, 50)] and runner.released == [(2, 4)]
    # A move whose slot is free again by now (its sequence finished too) has no tail to keep.
    slots.after_moves([SlotMove(1, 0, 50)], running())
    assert runner.tails == [(0, 30), (1, 50)] and runner.released == [(2, 4), (0, 2)]


async def test_the_idle_engine_releases_every_slot_after_the_prefix_copies(tiny_model_dir: Path) -> None:
    # A 60-token prompt and 8 tokens: the cache's fourth block (positions 48-63) holds generated
    # tokens, so it is copied out only when the request finishes, in the step that follows. The
    # idle engine must run that copy before it releases the slot, or the next turn loads zeros.
    engine = await start(tiny_model_dir, max_num_seqs=4)
    reference = await start(tiny_model_dir, max_num_seqs=4, prefix_caching=False)
    try:
        core = engine.core
        core._slots.idle_delay_s = 0.3  # the default second, shortened for the test
        rng = random.Random(3)
        prompt = [rng.randrange(3, 4000) for _ in range(60)]
        first = await submit_round(engine, [prompt], 8)
        layer = core.runner.cache.slot_layers[0]  # type: ignore[attr-defined]
        # Released pages read as zeros: the positions the request wrote go blank once the engine idles.
        await wait_until(lambda: not bool(layer.keys[0, :, :68].any()), timeout=10.0)
        turn = prompt + ids(first[0]) + [rng.randrange(3, 4000) for _ in range(5)]
        got = await submit_round(engine, [turn], 8)
        want = await submit_round(reference, [turn], 8)
        assert got[0][-1].num_cached_tokens == 64  # four blocks from the prefix cache, the last one generated
        assert ids(got[0]) == ids(want[0])  # and their K/V survived the release
        assert bool(layer.keys[0, :, :68].any())  # the new request wrote its slot again
    finally:
        engine.stop()
        reference.stop()
        await asyncio.sleep(0)


async def test_a_token_budget_serves_the_same_tokens_while_releasing_every_step(tiny_model_dir: Path) -> None:
    # Sequences of different lengths finish out of order, so the last slot's sequence moves into
    # each hole (a shorter one into a longer one's slot, whose tail is released at once) and the
    # free slots go back every step: no token of a running sequence may be lost on the way.
    rng = random.Random(11)
    # Prompts of several pages (a page holds 32 positions of a K/V head of the `s` model).
    lengths = [(rng.randrange(40, 150), rng.randrange(2, 40)) for _ in range(12)]
    requests = [([rng.randrange(3, 4000) for _ in range(n)], max_tokens) for n, max_tokens in lengths]
    bounded = await start(tiny_model_dir, max_num_seqs=4, max_kv_tokens=400, kv_slack_tokens=8)
    reference = await start(tiny_model_dir, max_num_seqs=4)
    try:
        assert bounded.core._slots.at_once and not reference.core._slots.at_once

        async def serve(engine: AsyncEngine) -> list[list[int]]:
            groups = [run(engine.submit([(prompt, greedy(n))])) for prompt, n in requests]
            return [ids(outputs[0]) for outputs in await asyncio.gather(*groups)]

        got, want = await serve(bounded), await serve(reference)
        assert got == want
        assert [len(tokens) for tokens in got] == [n for _, n in requests]
        assert bounded.core.scheduler.num_reserved_tokens == 0
    finally:
        bounded.stop()
        reference.stop()
        await asyncio.sleep(0)
