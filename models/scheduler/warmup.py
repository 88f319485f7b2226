"""The engine's warmup batch (models/engine/core.py)."""

from __future__ import annotations

import math

from models.config import SchedulerConfig
from models.sampling.params import SamplingParams
from models.scheduler.sequence import Sequence


def warmup_sequences(config: SchedulerConfig) -> list[Sequence]:
    """Warmup's batch (models/engine/core.py): every slot, a short prompt, greedy and sampled rows
    alike, so the step runs the shapes serving will use before /ready, a decode step of every slot
    among them (its time is the engine's pace at full load). Where the step's token budget splits
    the prompts over several steps, the first ones generate until the last ones have joined: a
    step gives prompts at least its budget less one token per decoding row."""
    n = config.max_num_seqs
    prompt_len = max(1, min(16, config.max_model_len - 3))
    prefill_steps = math.ceil(n * prompt_len / (config.max_num_batched_tokens - n))
    max_tokens = max(1, min(prefill_steps + 1, config.max_model_len - prompt_len))
    return [
        Sequence(
            f"warmup-{i}",
            [0] * prompt_len,
            SamplingParams(max_tokens=max_tokens, temperature=0.0 if i % 2 else 1.0, ignore_eos=True),
        )
        for i in range(n)
    ]
