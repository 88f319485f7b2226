"""Light and heavy lanes in the scheduler (models/scheduler/lanes.py): heavy sequences fill the
batch while nothing light waits; a light one never waits behind them for a slot."""

from __future__ import annotations

from models.config import SchedulerConfig
from models.sampling.params import SamplingParams
from models.scheduler.output import SchedulerOutput
from models.scheduler.scheduler import Scheduler
from models.scheduler.sequence import Sequence, SequenceStatus


def scheduler(heavy_tokens: int = 100, max_num_seqs: int = 4) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=256,
        max_model_len=512,
        heavy_sequence_tokens=heavy_tokens,
        light_lane_share=0.25,  # of 4 slots: heavy ones hold 3 while light ones wait
        preemption=False,  # lanes alone
    )
    return Scheduler(config, eos_token_ids=[2])


def seq(request_id: str, max_tokens: int, tier: int = 0) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Sequence(request_id, [100 + i for i in range(8)], params, tier=tier)


def step(s: Scheduler) -> SchedulerOutput:
    out = s.schedule()
    s.update_from_output(out, [1000 + x.num_output_tokens for x in out.sampled])
    return out


def running(s: Scheduler) -> list[str]:
    return [x.request_id for x in s.running]


def test_a_sequence_is_heavy_by_its_prompt_and_max_tokens() -> None:
    s = scheduler(heavy_tokens=100)
    light, heavy = seq("light", max_tokens=91), seq("heavy", max_tokens=92)  # 8 + 92 = 100
    s.add(light)
    s.add(heavy)
    assert (light.heavy, heavy.heavy) == (False, True)
    off = scheduler(heavy_tokens=0)
    unbounded = seq("long", max_tokens=500)
    off.add(unbounded)
    assert not unbounded.heavy  # one lane


def test_heavy_sequences_fill_the_batch_while_nothing_light_waits() -> None:
    s = scheduler()
    for i in range(6):
        s.add(seq(f"h{i}", max_tokens=300))
    step(s)
    assert running(s) == ["h0", "h1", "h2", "h3"] and s.num_preempted == 0


def test_a_light_sequence_takes_the_latest_heavy_ones_slot_past_the_heavy_share() -> None:
    s = scheduler()
    for i in range(5):
        s.add(seq(f"h{i}", max_tokens=300))
    step(s)
    s.add(seq("light", max_tokens=10))
    out = step(s)
    assert running(s) == ["h0", "h1", "h2", "light"] and s.num_preempted == 1
    assert "light" in [chunk.seq.request_id for chunk in out.prefills]
    s.add(seq("light2", max_tokens=10))
    step(s)
    assert "light2" not in running(s)  # heavy hold 3 = their share: no more preemption, it waits a slot
    while "light" in running(s):
        step(s)
    step(s)
    assert "light2" in running(s)  # the freed slot goes to the light lane first


def test_a_heavy_head_waits_at_its_share_while_a_light_one_behind_it_runs() -> None:
    s = scheduler()
    for i in range(3):
        s.add(seq(f"h{i}", max_tokens=300))
    step(s)
    s.add(seq("h3", max_tokens=300))  # first in line, but heavy ones are at their share...
    s.add(seq("light", max_tokens=10))  # ...while a light one waits behind it
    step(s)
    assert running(s) == ["h0", "h1", "h2", "light"]


def test_a_light_sequence_never_takes_a_more_important_tiers_slot() -> None:
    s = scheduler()
    for i in range(4):
        s.add(seq(f"h{i}", max_tokens=300, tier=0))
    step(s)
    s.add(seq("light", max_tokens=10, tier=2))
    step(s)
    assert running(s) == ["h0", "h1", "h2", "h3"] and s.num_preempted == 0


def test_a_preempted_heavy_sequence_resumes_with_its_tokens() -> None:
    s = scheduler()
    for i in range(4):
        s.add(seq(f"h{i}", max_tokens=300))
    for _ in range(3):
        step(s)
    h3 = s.running[3]
    s.add(seq("light", max_tokens=2))
    step(s)
    assert h3.status is SequenceStatus.WAITING and h3.num_replayed == 3
    while h3.status is SequenceStatus.WAITING:
        step(s)
    step(s)
    assert h3.output_token_ids[:4] == [1000, 1001, 1002, 1003]


def test_a_light_sequence_behind_a_long_heavy_queue_still_gets_a_slot() -> None:
    """Found by the benchmark: with more heavy sequences waiting than the batch holds, the light one
    was past the candidates looked at, and waited for a heavy stream to end."""
    s = scheduler()
    for i in range(12):
        s.add(seq(f"h{i}", max_tokens=300))
    step(s)
    s.add(seq("light", max_tokens=10))
    step(s)
    assert "light" in running(s) and s.num_preempted == 1
