"""Tests for models/scheduler/scheduler.py: a pure state machine, driven with made-up token ids and no model.

`_engine_step` mirrors the engine loop (schedule, run, update_from_output), and
`_SimulatedCache` stands in for the KV cache: it records which request's data each slot holds and
how many positions of it are valid, applies the reported slot moves in order, and checks that every
chunk and decode writes on top of that same sequence's data.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from models.config import SchedulerConfig
from models.sampling.params import SamplingParams
from models.scheduler.output import PrefillChunk, SchedulerOutput, SlotMove
from models.scheduler.scheduler import Scheduler
from models.scheduler.sequence import FinishReason, Sequence, SequenceStatus

EOS = 2
TOKEN = 50  # an ordinary sampled token: neither eos nor a stop token


def _config(
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 256,
    max_prompt_chunk_while_decoding: int = 512,
) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        max_prompt_chunk_while_decoding=max_prompt_chunk_while_decoding,
    )


def _scheduler(**kwargs: int) -> Scheduler:
    return Scheduler(_config(**kwargs), eos_token_ids=[EOS])


def _seq(
    request_id: str,
    num_prompt_tokens: int = 4,
    *,
    max_tokens: int = 16,
    priority: int = 0,
    ignore_eos: bool = False,
    stop_token_ids: tuple[int, ...] = (),
) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=stop_token_ids)
    return Sequence(request_id, [100 + i for i in range(num_prompt_tokens)], params, priority)


def _engine_step(scheduler: Scheduler, sample: Callable[[Sequence], int] = lambda seq: TOKEN) -> SchedulerOutput:
    """One engine step as models/engine/core.py runs it, with `sample` in place of the model."""
    out = scheduler.schedule()
    scheduler.update_from_output(out, [sample(seq) for seq in out.sampled])
    return out


def _assert_compact(scheduler: Scheduler) -> None:
    assert [seq.slot for seq in scheduler.running] == list(range(scheduler.num_running))
    assert all(seq.status is SequenceStatus.RUNNING for seq in scheduler.running)


def _num_step_tokens(out: SchedulerOutput) -> int:
    return sum(chunk.num_tokens for chunk in out.prefills) + len(out.decodes)


class _SimulatedCache:
    """slot -> (request_id, number of valid positions), as the model runner's KV cache would hold."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.slots: dict[int, tuple[str, int]] = {}

    def apply_moves(self, moves: list[SlotMove]) -> None:
        for move in moves:
            assert 0 <= move.dst < move.src < self.num_slots, move
            request_id, num_valid = self.slots[move.src]
            assert move.num_tokens <= num_valid, f"{move} copies positions the source slot never computed"
            self.slots[move.dst] = (request_id, move.num_tokens)

    def prefill(self, chunk: PrefillChunk) -> None:
        slot = chunk.seq.slot
        assert 0 <= slot < self.num_slots
        if chunk.start > 0:
            # A later chunk attends to the earlier ones: they must be this sequence's, in this slot.
            assert self.slots.get(slot) == (chunk.seq.request_id, chunk.start), (chunk, self.slots.get(slot))
        self.slots[slot] = (chunk.seq.request_id, chunk.start + chunk.num_tokens)

    def decode(self, seq: Sequence) -> None:
        assert self.slots.get(seq.slot) == (seq.request_id, seq.num_computed_tokens), (seq, self.slots.get(seq.slot))
        self.slots[seq.slot] = (seq.request_id, seq.num_computed_tokens + 1)

    def run(self, out: SchedulerOutput) -> None:
        """What the model runner does with one step's plan, before update_from_output."""
        assert out.num_slots <= self.num_slots
        self.apply_moves(out.moves)
        for chunk in out.prefills:
            self.prefill(chunk)
        for seq in out.decodes:
            self.decode(seq)


# --- admission -------------------------------------------------------------------------------


def test_admits_up_to_max_num_seqs_and_the_rest_wait() -> None:
    scheduler = _scheduler(max_num_seqs=2)
    seqs = [_seq(f"r{i}") for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    assert (scheduler.num_waiting, scheduler.num_running) == (3, 0)

    out = scheduler.schedule()

    assert [chunk.seq for chunk in out.prefills] == seqs[:2]
    assert [(chunk.start, chunk.num_tokens) for chunk in out.prefills] == [(0, 4), (0, 4)]
    assert out.decodes == []
    assert out.num_slots == 2
    assert (scheduler.num_waiting, scheduler.num_running) == (1, 2)
    assert seqs[2].status is SequenceStatus.WAITING and seqs[2].slot == -1
    _assert_compact(scheduler)


def test_a_token_budget_admits_while_whole_lengths_fit_and_the_first_that_does_not_waits() -> None:
    # 100 tokens of K/V: each sequence is admitted for its prompt, max_tokens and 5 tokens of slack.
    config = SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256, max_kv_tokens=100, kv_slack_tokens=5
    )
    scheduler = Scheduler(config, eos_token_ids=[EOS])
    for name, max_tokens in (("a", 20), ("b", 20), ("c", 40), ("d", 2), ("e", 300)):
        scheduler.add(_seq(name, max_tokens=max_tokens, ignore_eos=True))
    _engine_step(scheduler)
    # a and b: 29 tokens each; c (49) would make 107: c waits, and d (11) behind it with it.
    assert [seq.request_id for seq in scheduler.running] == ["a", "b"]
    assert scheduler.num_reserved_tokens == 58 and scheduler.num_waiting == 3
    scheduler.abort("a")
    _engine_step(scheduler)
    assert [seq.request_id for seq in scheduler.running] == ["b", "c", "d"]  # 29 + 49 + 11 = 89
    assert scheduler.num_reserved_tokens == 89
    # e is capped at max_model_len (256 + 5), more than the whole budget, which a fitted config
    # never allows: rather than wait for ever it runs once it would run alone.
    seen = set()
    while scheduler.has_work:
        _engine_step(scheduler)
        names = [seq.request_id for seq in scheduler.running]
        seen.update(names)
        assert scheduler.num_reserved_tokens <= 100 or names == ["e"]
    assert "e" in seen and scheduler.num_reserved_tokens == 0


def test_without_a_token_budget_only_slots_bound_admission() -> None:
    scheduler = _scheduler(max_num_seqs=3)
    for name in "abcd":
        scheduler.add(_seq(name, max_tokens=200))
    _engine_step(scheduler)
    assert scheduler.num_running == 3 and scheduler.num_reserved_tokens == 3 * 204


def test_waiting_sequence_takes_the_slot_a_finished_one_frees() -> None:
    scheduler = _scheduler(max_num_seqs=2)
    a, b, c = _seq("a"), _seq("b"), _seq("c")
    for seq in (a, b, c):
        scheduler.add(seq)
    _engine_step(scheduler)
    scheduler.finish(a, FinishReason.STOP)

    out = scheduler.schedule()

    # b moved from the last slot into a's hole; c joins at the end.
    assert out.moves == [SlotMove(src=1, dst=0, num_tokens=4)]
    assert out.decodes == [b]
    assert [chunk.seq for chunk in out.prefills] == [c]
    assert scheduler.running == [b, c]
    _assert_compact(scheduler)


def test_priority_admits_lower_first_and_fifo_within_a_level() -> None:
    scheduler = _scheduler(max_num_seqs=1)
    seqs = [
        _seq("low", priority=5),
        _seq("high-1", priority=-1),
        _seq("mid", priority=0),
        _seq("high-2", priority=-1),
        _seq("mid-2", priority=0),
    ]
    for seq in seqs:
        scheduler.add(seq)

    admitted = []
    while scheduler.has_work:
        out = scheduler.schedule()
        assert len(out.prefills) == 1
        admitted.append(out.prefills[0].seq.request_id)
        scheduler.finish(out.prefills[0].seq, FinishReason.STOP)

    assert admitted == ["high-1", "high-2", "mid", "mid-2", "low"]


def _admission_order(scheduler: Scheduler) -> list[str]:
    admitted = []
    while scheduler.has_work:
        out = scheduler.schedule()
        admitted.append(out.prefills[0].seq.request_id)
        scheduler.finish(out.prefills[0].seq, FinishReason.STOP)
    return admitted


def test_one_shares_burst_does_not_queue_another_share_behind_all_of_it() -> None:
    """The finding: FIFO within a priority, so one key's burst of 200 held every other key's
    request behind all of it. Shares now interleave: a request arriving behind a burst waits for
    about one of the burst's sequences, not all of them; a lone share keeps arrival order."""
    scheduler = _scheduler(max_num_seqs=1)
    burst = [_seq(f"a{i}") for i in range(6)]
    for seq in burst:
        seq.share = "key:a"
        scheduler.add(seq)
    first = scheduler.schedule().prefills[0].seq  # a0 runs; a1..a5 wait
    late = [_seq("b0"), _seq("b1"), _seq("c0")]
    late[0].share = late[1].share = "key:b"
    late[2].share = "key:c"
    for seq in late:
        scheduler.add(seq)
    scheduler.finish(first, FinishReason.STOP)
    assert _admission_order(scheduler) == ["a1", "b0", "c0", "a2", "b1", "a3", "a4", "a5"]
    assert len(scheduler._shares) == 0  # nothing kept for shares that no longer wait

    alone = _scheduler(max_num_seqs=1)
    for i in range(5):
        alone.add(_seq(f"s{i}"))
    assert _admission_order(alone) == [f"s{i}" for i in range(5)]


def test_a_share_whose_sequences_all_left_the_queue_is_forgotten() -> None:
    scheduler = _scheduler(max_num_seqs=1)
    scheduler.add(_seq("run"))
    scheduler.schedule()
    waiting = [_seq(f"w{i}") for i in range(3)]
    for seq in waiting:
        seq.share = "key:gone"
        scheduler.add(seq)
    for seq in waiting:
        scheduler.abort(seq.request_id)
    assert len(scheduler._shares) == 0


def test_add_rejects_an_empty_prompt() -> None:
    scheduler = _scheduler()
    with pytest.raises(ValueError, match="at least one prompt token"):
        scheduler.add(_seq("a", num_prompt_tokens=0))
    assert not scheduler.has_work


@pytest.mark.parametrize("num_prompt_tokens", [32, 33])
def test_add_rejects_a_prompt_that_leaves_no_room_to_generate(num_prompt_tokens: int) -> None:
    scheduler = _scheduler(max_model_len=32)
    with pytest.raises(ValueError, match="context length"):
        scheduler.add(_seq("a", num_prompt_tokens=num_prompt_tokens))
    assert not scheduler.has_work


def test_add_accepts_a_prompt_one_short_of_max_model_len_and_it_gets_one_token() -> None:
    scheduler = _scheduler(max_model_len=32)
    seq = _seq("a", num_prompt_tokens=31, max_tokens=100)
    scheduler.add(seq)
    _engine_step(scheduler)
    assert seq.finish_reason is FinishReason.LENGTH
    assert seq.num_output_tokens == 1


def test_add_rejects_a_duplicate_of_a_waiting_id() -> None:
    scheduler = _scheduler()
    scheduler.add(_seq("a"))
    with pytest.raises(ValueError, match="duplicate"):
        scheduler.add(_seq("a"))
    assert scheduler.num_waiting == 1


def test_add_rejects_a_duplicate_of_a_running_id() -> None:
    scheduler = _scheduler()
    scheduler.add(_seq("a"))
    scheduler.schedule()
    with pytest.raises(ValueError, match="duplicate"):
        scheduler.add(_seq("a"))
    assert (scheduler.num_waiting, scheduler.num_running) == (0, 1)


def test_id_of_a_finished_sequence_can_be_reused() -> None:
    scheduler = _scheduler()
    first = _seq("a", max_tokens=1)
    scheduler.add(first)
    _engine_step(scheduler)
    assert first.is_finished

    second = _seq("a", max_tokens=1)
    scheduler.add(second)
    out = _engine_step(scheduler)

    assert [chunk.seq for chunk in out.prefills] == [second]
    assert second.finish_reason is FinishReason.LENGTH


def test_readded_request_id_after_abort_while_waiting_is_scheduled() -> None:
    scheduler = _scheduler()
    scheduler.add(_seq("a"))
    scheduler.abort("a")
    retry = _seq("a")
    scheduler.add(retry)
    assert scheduler.num_waiting == 1

    out = scheduler.schedule()

    assert [chunk.seq for chunk in out.prefills] == [retry]
    assert retry.status is SequenceStatus.RUNNING


# --- slots and moves -------------------------------------------------------------------------


def _running_batch(scheduler: Scheduler, num_seqs: int) -> list[Sequence]:
    """Admit num_seqs sequences with distinct prompt lengths and run them to their first decode."""
    seqs = [_seq(f"r{i}", num_prompt_tokens=3 + i) for i in range(num_seqs)]
    for seq in seqs:
        scheduler.add(seq)
    _engine_step(scheduler)
    assert scheduler.running == seqs
    return seqs


def test_finish_moves_the_last_slot_into_the_hole_and_reports_it_once() -> None:
    scheduler = _scheduler(max_num_seqs=4)
    r0, r1, r2, r3 = _running_batch(scheduler, 4)

    scheduler.finish(r1, FinishReason.STOP)

    assert scheduler.running == [r0, r3, r2]
    assert r1.slot == -1
    _assert_compact(scheduler)
    out = _engine_step(scheduler)
    # r3 had its 6-token prompt computed; its first output token is not in the cache yet.
    assert out.moves == [SlotMove(src=3, dst=1, num_tokens=6)]
    assert out.num_slots == 3
    assert _engine_step(scheduler).moves == []


def test_finishing_the_last_slot_moves_nothing() -> None:
    scheduler = _scheduler(max_num_seqs=4)
    r0, r1, r2 = _running_batch(scheduler, 3)

    scheduler.finish(r2, FinishReason.STOP)

    assert scheduler.running == [r0, r1]
    assert scheduler.schedule().moves == []


def test_several_finishes_before_a_step_report_moves_that_replay_in_order() -> None:
    scheduler = _scheduler(max_num_seqs=4)
    r0, r1, r2, r3 = _running_batch(scheduler, 4)

    scheduler.finish(r1, FinishReason.STOP)  # r3: 3 -> 1
    scheduler.finish(r3, FinishReason.STOP)  # r2: 2 -> 1, over r3's copy
    scheduler.finish(r0, FinishReason.ABORT)  # r2: 1 -> 0

    assert scheduler.running == [r2]
    out = scheduler.schedule()
    assert out.moves == [
        SlotMove(src=3, dst=1, num_tokens=6),
        SlotMove(src=2, dst=1, num_tokens=5),
        SlotMove(src=1, dst=0, num_tokens=5),
    ]
    cache = {0: "r0", 1: "r1", 2: "r2", 3: "r3"}
    for move in out.moves:
        cache[move.dst] = cache[move.src]
    assert cache[0] == "r2"


def test_move_of_a_mid_prefill_sequence_copies_only_its_computed_tokens() -> None:
    scheduler = _scheduler(max_num_seqs=4, max_num_batched_tokens=16)
    a = _seq("a", num_prompt_tokens=4)
    long = _seq("long", num_prompt_tokens=40)
    scheduler.add(a)
    scheduler.add(long)
    _engine_step(scheduler)  # a: 4 prompt tokens; long: 12 of its 40
    assert long.num_computed_tokens == 12

    scheduler.finish(a, FinishReason.STOP)
    out = scheduler.schedule()

    assert out.moves == [SlotMove(src=1, dst=0, num_tokens=12)]
    assert out.prefills == [PrefillChunk(long, 12, 16)]


def test_finish_twice_releases_the_slot_once() -> None:
    scheduler = _scheduler(max_num_seqs=4)
    r0, r1, r2 = _running_batch(scheduler, 3)

    scheduler.finish(r0, FinishReason.STOP)
    scheduler.finish(r0, FinishReason.ERROR)

    assert r0.finish_reason is FinishReason.STOP
    assert scheduler.running == [r2, r1]
    _assert_compact(scheduler)
    assert scheduler.schedule().moves == [SlotMove(src=2, dst=0, num_tokens=5)]


def _check_random_run(seed: int, num_adding_steps: int) -> int:
    """Random adds, steps, stop tokens and aborts against a simulated cache; return finished count."""
    rng = random.Random(seed)
    config = _config(
        max_num_seqs=rng.randint(1, 6),
        max_num_batched_tokens=rng.choice([8, 13, 32]),
        max_model_len=48,
        max_prompt_chunk_while_decoding=rng.choice([0, 5, 512]),
    )
    scheduler = Scheduler(config, eos_token_ids=[EOS])
    cache = _SimulatedCache(config.max_num_seqs)
    waiting: dict[str, Sequence] = {}  # the test's own view of the queue
    live: dict[str, Sequence] = {}
    num_finished = 0
    next_id = 0

    def sample(seq: Sequence) -> int:
        return EOS if rng.random() < 0.05 else TOKEN

    for step in itertools.count():
        adding = step < num_adding_steps  # then no more arrivals: the run drains
        if not adding and not scheduler.has_work:
            break
        assert step < 50 * num_adding_steps, "the scheduler stopped making progress"
        for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 3]) if adding else 0):
            seq = _seq(
                f"s{next_id}",
                num_prompt_tokens=rng.randint(1, 40),
                max_tokens=rng.randint(1, 12),
                priority=rng.randint(-2, 2),
            )
            next_id += 1
            scheduler.add(seq)
            waiting[seq.request_id] = seq
            live[seq.request_id] = seq
        # Aborts arrive between steps, for waiting or running sequences alike.
        if live and rng.random() < 0.15:
            request_id = rng.choice(sorted(live))
            aborted = scheduler.abort(request_id)
            assert aborted is not None and aborted is live.pop(request_id)
            waiting.pop(request_id, None)
            assert aborted.finish_reason is FinishReason.ABORT and aborted.slot == -1
            num_finished += 1
        _assert_compact(scheduler)

        out = scheduler.schedule()

        cache.run(out)
        assert out.num_slots == scheduler.num_running <= config.max_num_seqs
        assert _num_step_tokens(out) <= config.max_num_batched_tokens
        if out.decodes and config.max_prompt_chunk_while_decoding:
            assert all(chunk.num_tokens <= config.max_prompt_chunk_while_decoding for chunk in out.prefills)
        assert len({id(seq) for seq in out.sequences}) == len(out.sequences)
        assert all(seq.request_id in live and not seq.is_prefilling for seq in out.decodes)
        # Every running sequence that has its prompt computed decodes: none is starved.
        assert set(map(id, out.decodes)) == {id(seq) for seq in scheduler.running if not seq.is_prefilling}
        for chunk in out.prefills:
            assert chunk.start == chunk.seq.num_computed_tokens and chunk.num_tokens > 0
            if chunk.seq.request_id in waiting:
                # Admission in (priority, arrival) order: nobody still waiting should have gone first.
                admitted = waiting.pop(chunk.seq.request_id)
                assert all(
                    (s.priority, s.arrival_order) > (admitted.priority, admitted.arrival_order)
                    for s in waiting.values()
                )
        _assert_compact(scheduler)

        # The invariant the model runner relies on: once the step's moves are applied and its
        # forward pass has run, every running sequence's K/V, all of it, is in its own slot.
        planned = {id(chunk.seq): chunk.num_tokens for chunk in out.prefills} | {id(seq): 1 for seq in out.decodes}
        for seq in scheduler.running:
            assert cache.slots[seq.slot] == (seq.request_id, seq.num_computed_tokens + planned.get(id(seq), 0))
        assert all(seq.num_computed_tokens + planned[id(seq)] == seq.num_tokens for seq in out.sampled)
        reasons = scheduler.update_from_output(out, [sample(seq) for seq in out.sampled])
        for seq, reason in zip(out.sampled, reasons, strict=True):
            if reason is not None:
                assert seq.is_finished and seq.slot == -1
                del live[seq.request_id]
                num_finished += 1
                assert seq.num_output_tokens <= seq.params.max_tokens
                assert seq.num_tokens <= config.max_model_len

        for seq in scheduler.running:
            if seq.output_token_ids:
                assert seq.num_computed_tokens == seq.num_tokens - 1
            else:
                assert 0 < seq.num_computed_tokens < seq.num_prompt_tokens
        # A chunk smaller than the rest of a prompt uses up the budget, so at most one is part-way.
        assert sum(1 for seq in scheduler.running if 0 < seq.num_computed_tokens < seq.num_prompt_tokens) <= 1
        assert scheduler.num_waiting == len(waiting)
        assert scheduler.num_running == len(live) - len(waiting)

    assert not live
    assert num_finished == next_id
    return num_finished


@pytest.mark.parametrize("seed", range(12))
def test_random_traffic_keeps_every_running_sequence_in_its_own_slot(seed: int) -> None:
    num_finished = _check_random_run(seed, num_adding_steps=200)
    assert num_finished > 50  # the run exercised real traffic, not an idle scheduler


# --- chunked prefill -------------------------------------------------------------------------


def test_long_prompt_is_split_across_steps_while_running_sequences_decode() -> None:
    scheduler = _scheduler(max_num_seqs=4, max_num_batched_tokens=16)
    a, b = _seq("a", max_tokens=100), _seq("b", max_tokens=100)
    scheduler.add(a)
    scheduler.add(b)
    _engine_step(scheduler)
    long = _seq("long", num_prompt_tokens=40)
    scheduler.add(long)

    chunks = []
    while long.is_prefilling:
        out = _engine_step(scheduler)
        assert out.decodes == [a, b]
        assert _num_step_tokens(out) <= 16
        chunks.append((out.prefills[0].start, out.prefills[0].num_tokens, out.prefills[0].completes_prompt))

    # Budget per step: 16 tokens minus the 2 decode rows.
    assert chunks == [(0, 14, False), (14, 14, False), (28, 12, True)]
    assert long.num_output_tokens == 1
    assert a.num_output_tokens == b.num_output_tokens == 4
    assert _engine_step(scheduler).decodes == [a, b, long]


def test_while_sequences_decode_a_long_prompt_takes_at_most_the_cap_per_step() -> None:
    scheduler = _scheduler(max_num_seqs=8, max_num_batched_tokens=64, max_prompt_chunk_while_decoding=10)
    # Nothing decoding: a prompt longer than the cap still goes in whole, for its first token.
    first = _seq("first", num_prompt_tokens=30)
    scheduler.add(first)
    out = _engine_step(scheduler)
    assert out.decodes == [] and [chunk.num_tokens for chunk in out.prefills] == [30]

    # Beside a decoding stream: a long prompt 10 tokens a step, not the 63 the budget allows. The
    # short prompt ahead of it goes in whole; the one behind it waits for it, as with any prompt
    # left part-way (one at a time).
    short0, long, short1 = _seq("short0", num_prompt_tokens=8), _seq("long", num_prompt_tokens=25), _seq("short1")
    for seq in (short0, long, short1):
        scheduler.add(seq)
    steps = []
    for _ in range(3):
        out = _engine_step(scheduler)
        assert first in out.decodes
        steps.append([(c.seq.request_id, c.start, c.num_tokens) for c in out.prefills])
    assert steps == [
        [("short0", 0, 8), ("long", 0, 10)],
        [("long", 10, 10)],
        [("long", 20, 5), ("short1", 0, short1.num_prompt_tokens)],
    ]


def test_the_decoding_cap_is_per_prompt_not_per_step() -> None:
    # A burst of short prompts beside a decoding stream goes in whole, 40 tokens past a cap of 10.
    scheduler = _scheduler(max_num_seqs=8, max_num_batched_tokens=64, max_prompt_chunk_while_decoding=10)
    decoding = _running_batch(scheduler, 1)
    burst = [_seq(f"short{i}", num_prompt_tokens=8) for i in range(5)]
    for seq in burst:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert out.decodes == decoding and [(c.seq, c.num_tokens) for c in out.prefills] == [(s, 8) for s in burst]


def test_on_a_slow_machine_a_long_prompt_gets_the_paced_chunk_and_a_short_one_goes_whole() -> None:
    """Steps have shown a prompt token costs 10 ms: beside decoding streams a prompt longer than
    the token cap gets 0.5 s worth a step (the pacer's 64-token floor here), while a prompt within
    the cap still goes whole, as a burst of chat prompts does."""
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024)
    scheduler = Scheduler(config, eos_token_ids=[EOS])
    decoding = _running_batch(scheduler, 2)
    out = scheduler.schedule()
    scheduler.update_from_output(out, [TOKEN] * len(out.sampled), seconds=0.1)  # a decode step
    scheduler.pacer.observe(num_decodes=2, num_prompt_tokens=200, seconds=0.1 + 200 * 0.01)
    assert scheduler.pacer.cap() == 64
    short, long = _seq("short", num_prompt_tokens=300), _seq("long", num_prompt_tokens=700)
    scheduler.add(short)
    scheduler.add(long)
    out = scheduler.schedule()
    assert out.decodes == decoding
    assert [(c.seq, c.num_tokens) for c in out.prefills] == [(short, 300), (long, 64)]
    scheduler.update_from_output(out, [TOKEN] * len(out.sampled), seconds=0.1 + 364 * 0.01)
    out = scheduler.schedule()
    assert [(c.seq, c.start, c.num_tokens) for c in out.prefills] == [(long, 64, 64)]
    # Nothing decoding: no pacing, the budget's whole share.
    idle = Scheduler(config, eos_token_ids=[EOS])
    idle.pacer.observe(num_decodes=0, num_prompt_tokens=200, seconds=2.0)
    idle.add(_seq("alone", num_prompt_tokens=700))
    assert [c.num_tokens for c in idle.schedule().prefills] == [512]


def test_a_decoding_cap_of_zero_leaves_the_whole_budget_to_prompts() -> None:
    scheduler = _scheduler(max_num_seqs=8, max_num_batched_tokens=64, max_prompt_chunk_while_decoding=0)
    decoding = _running_batch(scheduler, 4)
    scheduler.add(_seq("long", num_prompt_tokens=100))
    out = scheduler.schedule()
    assert out.decodes == decoding and [chunk.num_tokens for chunk in out.prefills] == [60]


def test_chunk_budget_is_max_num_batched_tokens_minus_num_decodes() -> None:
    scheduler = _scheduler(max_num_seqs=8, max_num_batched_tokens=30)
    decoding = _running_batch(scheduler, 5)
    scheduler.add(_seq("long", num_prompt_tokens=100))

    out = scheduler.schedule()

    assert out.decodes == decoding
    assert [(chunk.start, chunk.num_tokens) for chunk in out.prefills] == [(0, 25)]


def test_prefill_under_way_gets_the_budget_before_new_admissions() -> None:
    scheduler = _scheduler(max_num_seqs=4, max_num_batched_tokens=16)
    long = _seq("long", num_prompt_tokens=40, priority=5)
    scheduler.add(long)
    _engine_step(scheduler)
    urgent = _seq("urgent", priority=-5)
    scheduler.add(urgent)

    out = _engine_step(scheduler)

    # The continuing prompt takes the whole budget; the new sequence, however urgent, waits.
    assert out.prefills == [PrefillChunk(long, 16, 16)]
    assert scheduler.num_waiting == 1
    out = _engine_step(scheduler)
    assert [(chunk.seq.request_id, chunk.start, chunk.num_tokens) for chunk in out.prefills] == [
        ("long", 32, 8),
        ("urgent", 0, 4),
    ]


def test_leftover_budget_after_a_completed_prompt_admits_the_next_sequence() -> None:
    scheduler = _scheduler(max_num_seqs=4, max_num_batched_tokens=16)
    first, second = _seq("first", num_prompt_tokens=10), _seq("second", num_prompt_tokens=10)
    scheduler.add(first)
    scheduler.add(second)

    out = scheduler.schedule()

    assert out.prefills == [PrefillChunk(first, 0, 10), PrefillChunk(second, 0, 6)]
    assert out.prefills[0].completes_prompt and not out.prefills[1].completes_prompt


# --- abort -----------------------------------------------------------------------------------


def test_abort_of_a_waiting_sequence_removes_it_from_the_queue() -> None:
    scheduler = _scheduler(max_num_seqs=1)
    a, b, c = _seq("a"), _seq("b"), _seq("c")
    for seq in (a, b, c):
        scheduler.add(seq)
    scheduler.schedule()
    assert scheduler.num_waiting == 2

    assert scheduler.abort("b") is b

    assert scheduler.num_waiting == 1
    assert b.status is SequenceStatus.FINISHED and b.finish_reason is FinishReason.ABORT
    scheduled = []
    while scheduler.has_work:
        out = _engine_step(scheduler)
        scheduled += [seq.request_id for seq in out.sequences]
    assert "b" not in scheduled
    assert "c" in scheduled
    assert b.num_computed_tokens == 0 and b.output_token_ids == []


def test_abort_of_the_only_waiting_sequence_leaves_no_work() -> None:
    scheduler = _scheduler()
    scheduler.add(_seq("a"))
    scheduler.abort("a")
    assert not scheduler.has_work
    assert scheduler.schedule().is_empty


def test_abort_of_a_running_sequence_frees_its_slot_by_the_next_schedule() -> None:
    scheduler = _scheduler(max_num_seqs=2)
    a, b = _seq("a"), _seq("b")
    scheduler.add(a)
    scheduler.add(b)
    _engine_step(scheduler)
    c = _seq("c")
    scheduler.add(c)

    assert scheduler.abort("a") is a

    assert a.finish_reason is FinishReason.ABORT and a.slot == -1
    out = scheduler.schedule()
    assert out.moves == [SlotMove(src=1, dst=0, num_tokens=4)]
    assert out.decodes == [b]
    assert [chunk.seq for chunk in out.prefills] == [c]
    assert c.slot == 1
    _assert_compact(scheduler)


def test_abort_of_an_unknown_id_returns_none() -> None:
    scheduler = _scheduler()
    scheduler.add(_seq("a"))
    assert scheduler.abort("nope") is None
    assert scheduler.num_waiting == 1


def test_abort_of_a_finished_id_returns_none() -> None:
    scheduler = _scheduler()
    seq = _seq("a", max_tokens=1)
    scheduler.add(seq)
    _engine_step(scheduler)
    assert seq.finish_reason is FinishReason.LENGTH
    assert scheduler.abort("a") is None
    assert seq.finish_reason is FinishReason.LENGTH


# --- update_from_output: computed tokens, sampled tokens, stops -----------------------------


def _reasons(scheduler: Scheduler, seq: Sequence, tokens: list[int]) -> list[FinishReason | None]:
    """Run `seq` alone, sampling `tokens` one per step; the finish reason of each step's token."""
    scheduler.add(seq)
    reasons = []
    for token in tokens:
        out = scheduler.schedule()
        assert out.sampled == [seq]
        (reason,) = scheduler.update_from_output(out, [token])
        reasons.append(reason)
        if reason is not None:
            break
    return reasons


def test_update_stops_on_eos_and_finishes_the_sequence() -> None:
    scheduler = _scheduler()
    seq = _seq("a")
    assert _reasons(scheduler, seq, [TOKEN, EOS, TOKEN]) == [None, FinishReason.STOP]
    assert seq.output_token_ids == [TOKEN, EOS]
    assert seq.is_finished and seq.finish_reason is FinishReason.STOP and scheduler.num_running == 0


def test_update_ignores_eos_with_ignore_eos() -> None:
    assert _reasons(_scheduler(), _seq("a", ignore_eos=True), [EOS, EOS]) == [None, None]


def test_update_stops_on_a_stop_token_id_even_with_ignore_eos() -> None:
    seq = _seq("a", ignore_eos=True, stop_token_ids=(77, 78))
    assert _reasons(_scheduler(), seq, [TOKEN, 78]) == [None, FinishReason.STOP]


def test_update_stops_at_max_tokens_with_length() -> None:
    assert _reasons(_scheduler(), _seq("a", max_tokens=3), [TOKEN] * 4) == [None, None, FinishReason.LENGTH]


def test_update_stop_token_at_max_tokens_is_stop() -> None:
    assert _reasons(_scheduler(), _seq("a", max_tokens=1), [EOS]) == [FinishReason.STOP]


def test_update_stops_at_max_model_len_with_length() -> None:
    seq = _seq("a", num_prompt_tokens=7, max_tokens=100)
    assert _reasons(_scheduler(max_model_len=10), seq, [TOKEN] * 4) == [None, None, FinishReason.LENGTH]
    assert seq.num_tokens == 10


def test_update_counts_chunks_and_decodes_as_computed() -> None:
    scheduler = _scheduler(max_num_seqs=4, max_num_batched_tokens=16)
    a = _seq("a", num_prompt_tokens=5)
    long = _seq("long", num_prompt_tokens=30)
    scheduler.add(a)
    scheduler.add(long)

    out = scheduler.schedule()
    assert (a.num_computed_tokens, long.num_computed_tokens) == (0, 0)  # planned, not yet run
    assert out.sampled == [a]  # long's chunk ends mid-prompt: nothing to sample
    scheduler.update_from_output(out, [TOKEN])
    assert (a.num_computed_tokens, long.num_computed_tokens) == (5, 11)
    # A decoding sequence has every token but the last sampled one in the cache.
    assert a.num_computed_tokens == a.num_tokens - 1

    scheduler.update_from_output(scheduler.schedule(), [TOKEN])
    assert (a.num_computed_tokens, long.num_computed_tokens) == (6, 26)
    assert a.num_computed_tokens == a.num_tokens - 1


# --- counters --------------------------------------------------------------------------------


def test_has_work_and_counts_follow_a_request_through_its_life() -> None:
    scheduler = _scheduler(max_num_seqs=1)
    assert (scheduler.has_work, scheduler.num_waiting, scheduler.num_running) == (False, 0, 0)
    a, b = _seq("a", max_tokens=2), _seq("b", max_tokens=1)
    scheduler.add(a)
    scheduler.add(b)
    assert (scheduler.has_work, scheduler.num_waiting, scheduler.num_running) == (True, 2, 0)

    _engine_step(scheduler)
    assert (scheduler.has_work, scheduler.num_waiting, scheduler.num_running) == (True, 1, 1)
    _engine_step(scheduler)  # a reaches max_tokens and leaves
    assert a.finish_reason is FinishReason.LENGTH
    assert (scheduler.has_work, scheduler.num_waiting, scheduler.num_running) == (True, 1, 0)
    _engine_step(scheduler)  # b is admitted, prefilled and finishes on its first token
    assert b.finish_reason is FinishReason.LENGTH
    assert (scheduler.has_work, scheduler.num_waiting, scheduler.num_running) == (False, 0, 0)
    assert scheduler.schedule().is_empty
