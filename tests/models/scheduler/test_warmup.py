"""The warmup batch: whatever the step's token budget, warmup runs a decode step of every slot (the
engine times it: the step-time degradation signal is read against it)."""

from __future__ import annotations

import pytest

from models.config import SchedulerConfig
from models.scheduler.scheduler import Scheduler
from models.scheduler.warmup import warmup_sequences

TOKEN = 50


@pytest.mark.parametrize(
    ("max_num_seqs", "max_num_batched_tokens", "max_model_len"),
    [(32, 2048, 4096), (8, 64, 512), (8, 9, 512), (64, 256, 2048), (4, 16, 8)],
)
def test_warmup_runs_a_decode_step_of_every_slot(
    max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int
) -> None:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len
    )
    scheduler = Scheduler(config, eos_token_ids=[2])
    seqs = warmup_sequences(config)
    assert len(seqs) == max_num_seqs and all(
        seq.num_prompt_tokens + seq.params.max_tokens <= max_model_len for seq in seqs
    )
    for seq in seqs:
        scheduler.add(seq)
    widest, steps = 0, 0
    while scheduler.has_work:
        out = scheduler.schedule()
        scheduler.update_from_output(out, [TOKEN] * len(out.sampled))
        if not out.prefills:
            widest = max(widest, len(out.decodes))
        steps += 1
        assert steps < 1000
    assert widest == max_num_seqs
