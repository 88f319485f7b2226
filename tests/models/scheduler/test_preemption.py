"""Preemption by tier in the scheduler (models/scheduler/preemption.py), driven as the engine
drives it, with made-up tokens: who gives up its slot, how it resumes, and who never does."""

from __future__ import annotations

from models.config import SchedulerConfig
from models.sampling.params import SamplingParams
from models.scheduler.output import SchedulerOutput
from models.scheduler.queue_deadline import QueueDeadline
from models.scheduler.scheduler import Scheduler
from models.scheduler.sequence import Sequence, SequenceStatus


def scheduler(max_num_seqs: int = 2, preemption: bool = True, max_kv_tokens: int = 0) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=64,
        max_model_len=256,
        preemption=preemption,
        max_kv_tokens=max_kv_tokens,
        kv_slack_tokens=0,
    )
    return Scheduler(config, eos_token_ids=[2])


def seq(request_id: str, tier: int, priority: int = 0, max_tokens: int = 20) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Sequence(request_id, [100 + i for i in range(6)], params, priority, tier=tier)


def step(s: Scheduler) -> SchedulerOutput:
    out = s.schedule()
    # Each sequence samples its own count of tokens so far: a resumed one continues the count.
    s.update_from_output(out, [1000 + seq.num_output_tokens for seq in out.sampled])
    return out


def test_a_better_tier_takes_the_slot_of_the_latest_worse_one_which_resumes_where_it_was() -> None:
    s = scheduler()
    old, late = seq("old", tier=2), seq("late", tier=2)
    s.add(old)
    s.add(late)
    for _ in range(4):
        step(s)
    assert late.output_token_ids == [1000, 1001, 1002, 1003]
    urgent = seq("urgent", tier=0, max_tokens=2)
    s.add(urgent)
    out = step(s)
    assert [x.request_id for x in s.running] == ["old", "urgent"]  # the latest of the worst tier left
    assert late.status is SequenceStatus.WAITING and late.num_preemptions == 1 and s.num_preempted == 1
    assert late.num_replayed == 4 and late.num_computed_tokens == 0 and late.slot == -1
    assert urgent in [chunk.seq for chunk in out.prefills]
    while not urgent.is_finished:
        step(s)
    resumed = step(s)
    (chunk,) = [c for c in resumed.prefills if c.seq is late]
    assert chunk.start == 0 and chunk.num_tokens == 6 + 4  # its prompt and the 4 tokens it had
    assert chunk.completes_prompt and late in resumed.sampled
    assert late.output_token_ids == [1000, 1001, 1002, 1003, 1004]  # the count goes on: nothing redone
    assert late.num_prompt_tokens == 6 and late.num_cached_tokens == 0  # what the client is told is unchanged


def test_the_same_tier_and_a_better_priority_within_it_never_preempt() -> None:
    s = scheduler()
    for name in ("a", "b"):
        s.add(seq(name, tier=1))
    step(s)
    s.add(seq("same-tier", tier=1, priority=-100))
    s.add(seq("worse-tier", tier=3))
    step(s)
    assert [x.request_id for x in s.running] == ["a", "b"] and s.num_preempted == 0


def test_off_nothing_is_preempted() -> None:
    s = scheduler(preemption=False)
    s.add(seq("low", tier=2))
    s.add(seq("low2", tier=2))
    step(s)
    s.add(seq("urgent", tier=0))
    step(s)
    assert [x.request_id for x in s.running] == ["low", "low2"] and s.num_preempted == 0


def test_a_full_kv_budget_preempts_as_a_full_batch_does() -> None:
    s = scheduler(max_num_seqs=4, max_kv_tokens=60)  # two sequences of 6 + 20 tokens fit, not three
    s.add(seq("low", tier=2))
    s.add(seq("low2", tier=2))
    step(s)
    assert s.num_running == 2
    s.add(seq("urgent", tier=0))
    step(s)
    assert [x.request_id for x in s.running] == ["low", "urgent"] and s.num_preempted == 1


def test_as_many_as_the_better_tier_needs_in_one_step() -> None:
    s = scheduler(max_num_seqs=3)
    for name in ("x", "y", "z"):
        s.add(seq(name, tier=2))
    step(s)
    for name in ("u1", "u2"):
        s.add(seq(name, tier=0))
    step(s)
    assert [x.request_id for x in s.running] == ["x", "u1", "u2"] and s.num_preempted == 2


def test_the_queue_deadline_never_drops_a_preempted_sequence() -> None:
    s = scheduler()
    deadline = QueueDeadline(max_queue_seconds=10.0)
    low, low2 = seq("low", tier=2), seq("low2", tier=2)
    for x in (low, low2):
        s.add(x)
        deadline.add(x)
    step(s)
    s.add(seq("urgent", tier=0))
    step(s)
    assert low2.status is SequenceStatus.WAITING and low2.num_preemptions == 1
    assert deadline.expired(now=1e6) == []  # it started: only never-started requests expire
