"""When free slots' K/V memory goes back (models/slot_release.py): the policy on a recording
runner and a hand-driven clock; then the real engine, whose idle release must not lose a
finished sequence's prefix-cache copy (a cached prefix read back as zeros would change tokens)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from models.slot_release import SlotRelease
from tests.models.test_engine import tokens as ids
from tests.models.test_engine import wait_until
from tests.models.test_engine_prefix import start, submit_round


class Recorder:
    def __init__(self) -> None:
        self.released: list[tuple[int, int]] = []

    def release_slots(self, first_slot: int, end_slot: int) -> None:
        self.released.append((first_slot, end_slot))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def policy(num_slots: int = 8) -> tuple[SlotRelease, Recorder, Clock]:
    runner, clock = Recorder(), Clock()
    return SlotRelease(runner, num_slots, clock, busy_interval_s=10.0, idle_delay_s=1.0), runner, clock  # type: ignore[arg-type]


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
        slots.after_moves(num_slots)
        clock.now += 1.0
    assert runner.released == []
    clock.now += 10.0
    slots.after_moves(3)
    assert runner.released == [(3, 6)]  # up to the highest slot used since the last release
    slots.after_moves(2)
    assert runner.released == [(3, 6)]  # the next waits for its interval
    slots.after_moves(4)
    clock.now += 10.0
    slots.after_moves(1)
    assert runner.released == [(3, 6), (1, 4)]


def test_a_batch_that_stays_full_releases_nothing() -> None:
    slots, runner, clock = policy(4)
    for _ in range(5):
        clock.now += 20.0
        slots.after_moves(4)
    assert runner.released == []


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
