"""The batch-size policies (models/scheduler/batch_policy.py): continuous takes every slot; the
adaptive rule grows the batch with the logarithm of the demand, and the scheduler keeps to it."""

from __future__ import annotations

import math

from models.config import SchedulerConfig
from models.sampling.params import SamplingParams
from models.scheduler.batch_policy import batch_limit
from models.scheduler.scheduler import Scheduler
from models.scheduler.sequence import Sequence


def test_continuous_is_every_slot_whatever_the_demand() -> None:
    config = SchedulerConfig(max_num_seqs=32)
    assert {batch_limit(config, waiting, 0) for waiting in (0, 1, 5, 100)} == {32}


def test_the_log_rule_grows_with_demand_within_the_bounds() -> None:
    config = SchedulerConfig(max_num_seqs=32, batch_policy="log", batch_policy_base=4.0)
    assert batch_limit(config, 0, 0) == 1  # never below one
    assert batch_limit(config, 3, 0) == math.ceil(4 * math.log(4)) == 6
    assert batch_limit(config, 20, 10) == math.ceil(4 * math.log(31)) == 14
    assert batch_limit(config, 10_000, 0) == 32  # never above max_num_seqs


def test_the_scheduler_admits_no_more_than_the_rule_allows() -> None:
    config = SchedulerConfig(
        max_num_seqs=16, max_num_batched_tokens=512, max_model_len=256, batch_policy="log", batch_policy_base=2.0
    )
    s = Scheduler(config)
    for i in range(10):
        s.add(Sequence(f"r{i}", [5, 6, 7, 8], SamplingParams(max_tokens=8, ignore_eos=True)))
    out = s.schedule()
    assert len(out.prefills) == s.num_running == math.ceil(2 * math.log(11)) == 5
