"""Tests for models/scheduler/chunk_pacer.py: the cap a long prompt's chunk gets while others decode,
from step times handed to it (the engine measures them; here they are made up)."""

from __future__ import annotations

import pytest

from models.scheduler.chunk_pacer import GRAIN, ChunkPacer


def test_before_any_prompt_step_the_token_cap_holds() -> None:
    pacer = ChunkPacer(0.5, 512)
    assert pacer.cap() == 512 and pacer.seconds_per_token is None
    pacer.observe(num_decodes=8, num_prompt_tokens=0, seconds=0.1)  # decode steps say nothing of prompts
    assert pacer.cap() == 512


def test_a_slow_machine_gets_the_chunk_that_fits_the_target() -> None:
    pacer = ChunkPacer(0.5, 512)
    pacer.observe(num_decodes=8, num_prompt_tokens=0, seconds=0.1)
    pacer.observe(num_decodes=8, num_prompt_tokens=512, seconds=0.1 + 512 * 0.005)  # 5 ms a prompt token
    assert pacer.seconds_per_token == pytest.approx(0.005)
    assert pacer.cap() == 96  # 0.5 s / 5 ms = 100 tokens, in whole grains


def test_a_fast_machine_keeps_the_token_cap() -> None:
    pacer = ChunkPacer(0.5, 512)
    pacer.observe(num_decodes=32, num_prompt_tokens=512, seconds=0.02)
    assert pacer.cap() == 512


def test_however_slow_a_prompt_moves_at_least_min_tokens_a_step() -> None:
    pacer = ChunkPacer(0.5, 512, min_tokens=64)
    pacer.observe(num_decodes=0, num_prompt_tokens=64, seconds=30.0)
    assert pacer.cap() == 64
    assert ChunkPacer(0.5, 16, min_tokens=64).min_tokens == 16  # never above the token cap


@pytest.mark.parametrize(("target", "token_cap"), [(0.0, 512), (0.5, 0)])
def test_no_target_or_no_token_cap_means_no_pacing(target: float, token_cap: int) -> None:
    pacer = ChunkPacer(target, token_cap)
    pacer.observe(num_decodes=4, num_prompt_tokens=512, seconds=10.0)
    assert pacer.cap() == token_cap


def test_a_short_prompts_fixed_costs_weigh_by_its_tokens() -> None:
    """A 512-token chunk at 2 ms a token, then a 20-token chat prompt whose 50 ms are mostly fixed
    costs (2.5 ms a token): the estimate stays near 2 ms, not halfway to 2.5."""
    pacer = ChunkPacer(0.5, 512)
    pacer.observe(num_decodes=0, num_prompt_tokens=512, seconds=512 * 0.002)
    pacer.observe(num_decodes=0, num_prompt_tokens=20, seconds=0.05)
    per_token = pacer.seconds_per_token
    assert per_token is not None and 0.002 < per_token < 0.00205


def test_the_cap_follows_a_cost_that_grows_with_the_context() -> None:
    """Each chunk of a long prompt attends to more context: its tokens cost more, the chunks shrink,
    and a few steps after the cost settles the cap is what the new cost gives."""
    pacer = ChunkPacer(0.5, 512)
    caps = []
    for per_token in (0.001, 0.001, 0.002, 0.003, 0.004, 0.004, 0.004, 0.004, 0.004, 0.004):
        pacer.observe(num_decodes=4, num_prompt_tokens=pacer.cap(), seconds=pacer.cap() * per_token)
        caps.append(pacer.cap())
    assert caps == sorted(caps, reverse=True) and caps[1] == 480
    assert caps[-1] == int(0.5 / 0.004) // GRAIN * GRAIN == 96


def test_the_decode_rows_share_of_a_mixed_step_is_not_the_prompts() -> None:
    pacer = ChunkPacer(0.5, 512)
    for _ in range(3):
        pacer.observe(num_decodes=32, num_prompt_tokens=0, seconds=0.4)
    pacer.observe(num_decodes=32, num_prompt_tokens=100, seconds=0.4 + 100 * 0.004)
    assert pacer.seconds_per_token == pytest.approx(0.004)
    assert pacer.cap() == 96
