"""The engine's warmup batch (models/engine/core.py)."""

from __future__ import annotations

from models.config import SchedulerConfig
from models.sampling.params import SamplingParams
from models.scheduler.sequence import Sequence


def warmup_sequences(config: SchedulerConfig) -> list[Sequence]:
    """Warmup's batch (models/engine/core.py): every slot, a short prompt, two tokens each, greedy and
    sampled rows alike, so the step runs the shapes serving will use before /ready."""
    prompt_len = max(1, min(16, config.max_model_len - 3))
    return [
        Sequence(
            f"warmup-{i}",
            [0] * prompt_len,
            SamplingParams(max_tokens=2, temperature=0.0 if i % 2 else 1.0, ignore_eos=True),
        )
        for i in range(config.max_num_seqs)
    ]
