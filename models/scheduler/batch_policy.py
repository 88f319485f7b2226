"""How many sequences the batch may hold this step: all it can (continuous batching, the default),
or the design's adaptive rule, `min(max_num_seqs, base x ln(queue depth + 1))`, kept as a policy
to compare (`--batch-policy log`; docs/engine.md#batch-size-policy has the measurement that chose
the default).

Queue depth is the demand: the sequences waiting and those running. The rule holds the batch
small while demand is low and lets it grow with the logarithm of demand; continuous batching
takes every sequence a slot and the token budget allow.
"""

from __future__ import annotations

import math

from models.config import SchedulerConfig

POLICIES = ("continuous", "log")


def batch_limit(config: SchedulerConfig, num_waiting: int, num_running: int) -> int:
    if config.batch_policy != "log":
        return config.max_num_seqs
    adaptive = math.ceil(config.batch_policy_base * math.log(num_waiting + num_running + 1))
    return max(1, min(config.max_num_seqs, adaptive))
