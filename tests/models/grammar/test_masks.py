"""A step's grammar masks: the one-bit test agrees with the unpacked mask, masks computed ahead
on the worker equal those computed in line, a mask touches only its own rows, and greedy rows
under a grammar get the best allowed token whether or not the raw argmax is allowed."""

from __future__ import annotations

import os
import random

import pytest
import torch
from llguidance import LLMatcher
from transformers import AutoTokenizer

from models.grammar.compiler import GrammarCompiler, json_schema_grammar
from models.grammar.masks import GrammarMasks, MaskWorker
from models.loading import tiny
from models.sampling.params import SamplingParams
from models.sampling.sampler import Sampler, SamplingRow

CPU = torch.device("cpu")
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    hf = AutoTokenizer.from_pretrained(tiny.ensure_tokenizer())
    return GrammarCompiler(hf, len(hf), (tiny.IM_END_ID, tiny.ENDOFTEXT_ID))


def walked(compiler: GrammarCompiler, steps: int, seed: int) -> LLMatcher:
    """A matcher `steps` random allowed tokens into a document (structure and string states)."""
    matcher = compiler.matcher(json_schema_grammar(SCHEMA))
    rng = random.Random(seed)
    for _ in range(steps):
        masks = GrammarMasks.compute([0], [matcher], compiler.vocab_size)
        allowed = (~masks.disallowed[0]).nonzero().squeeze(1).tolist()
        if matcher.is_stopped() or not allowed:
            break
        assert matcher.consume_token(rng.choice(allowed))
    return matcher


def test_the_bit_test_agrees_with_the_unpacked_mask(compiler: GrammarCompiler) -> None:
    matchers = [walked(compiler, steps, seed) for seed, steps in enumerate((0, 1, 3, 6))]
    masks = GrammarMasks.compute([0, 1, 2, 3], matchers, compiler.vocab_size)
    for k in range(len(matchers)):
        allowed = [masks.allows(k, t) for t in range(compiler.vocab_size)]
        assert allowed == (~masks.disallowed[k]).tolist()
        assert any(allowed)


def test_masks_computed_ahead_equal_masks_computed_in_line(compiler: GrammarCompiler) -> None:
    worker = MaskWorker(compiler.vocab_size)
    assert worker.start([], []) is None
    try:
        for round_ in range(2):  # and again after a close
            matchers = [walked(compiler, steps, seed) for seed, steps in enumerate((2, 5))]
            pending = worker.start([1, 3], matchers)
            assert pending is not None
            ahead = pending.result(timeout=10)
            in_line = GrammarMasks.compute([1, 3], matchers, compiler.vocab_size)
            assert ahead.rows == [1, 3]
            assert (ahead.bitmask == in_line.bitmask).all()
            assert torch.equal(ahead.disallowed, in_line.disallowed)
            if round_ == 0:
                worker.close()
    finally:
        worker.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2, reason="Linux, 2+ CPUs")
def test_the_mask_thread_gets_no_thread_team_of_its_own(compiler: GrammarCompiler) -> None:
    """Each thread that runs a parallel torch op gets OpenMP workers of its own, and with more of
    those than CPUs every op of the engine's steps slows down for good (MaskWorker says why): the
    worker adds its own thread to the process and nothing else, even for masks big enough that a
    torch op on them would go parallel."""
    matchers = [walked(compiler, steps, seed) for seed, steps in enumerate((0, 1, 3, 6, 2, 5, 4, 7))]
    assert len(matchers) * compiler.vocab_size > 32768  # torch's grain for going parallel
    worker = MaskWorker(compiler.vocab_size)
    try:
        before = len(os.listdir("/proc/self/task"))
        pending = worker.start(list(range(len(matchers))), matchers)
        assert pending is not None
        masks = pending.result(timeout=10)
        after = len(os.listdir("/proc/self/task"))
    finally:
        worker.close()
    assert masks.disallowed.shape == (len(matchers), compiler.vocab_size)
    assert after <= before + 1


def test_a_mask_applies_to_its_own_rows_only(compiler: GrammarCompiler) -> None:
    masks = GrammarMasks.compute([1], [walked(compiler, 2, 0)], compiler.vocab_size)
    x = torch.randn(3, compiler.vocab_size)
    before = x.clone()
    masks.apply(x, [0, 1, 2])
    assert torch.equal(x[[0, 2]], before[[0, 2]])
    forbidden = masks.disallowed[0]
    assert torch.isneginf(x[1][forbidden]).all()
    assert torch.equal(x[1][~forbidden], before[1][~forbidden])
    untouched = torch.randn(2, compiler.vocab_size)
    copy = untouched.clone()
    masks.apply(untouched, [0, 2])  # a group without the constrained row
    assert torch.equal(untouched, copy)


@pytest.mark.parametrize("ahead", [True, False], ids=["masks given", "masks in line"])
def test_greedy_rows_get_the_best_allowed_token(compiler: GrammarCompiler, ahead: bool) -> None:
    vocab_size = compiler.vocab_size
    sampler = Sampler(vocab_size, CPU)
    grammar = json_schema_grammar(SCHEMA)
    rng = random.Random(7)
    generator = torch.Generator().manual_seed(7)
    outcomes = set()
    for trial in range(24):
        matchers = [walked(compiler, rng.randrange(5), 100 * trial + i) for i in range(3)]
        truth = GrammarMasks.compute([0, 1, 2], matchers, vocab_size)
        logits = torch.randn(5, vocab_size, generator=generator)
        # Row 0: its raw argmax made allowed; row 1: made forbidden; row 2 with a bias too.
        allowed_0 = (~truth.disallowed[0]).nonzero().squeeze(1)
        logits[0, allowed_0[trial % len(allowed_0)]] = 50.0
        forbidden_1 = truth.disallowed[1].nonzero().squeeze(1)
        logits[1, forbidden_1[trial % len(forbidden_1)]] = 50.0
        bias = {int(forbidden_1[0]): 5.0}
        rows = [
            SamplingRow(SamplingParams(max_tokens=4, temperature=0.0, grammar=grammar), None, [], matchers[0]),
            SamplingRow(SamplingParams(max_tokens=4, temperature=0.0, grammar=grammar), None, [], matchers[1]),
            SamplingRow(
                SamplingParams(max_tokens=4, temperature=0.0, grammar=grammar, logit_bias=bias), None, [], matchers[2]
            ),
            SamplingRow(SamplingParams(max_tokens=4, temperature=0.0)),
            SamplingRow(SamplingParams(max_tokens=4, temperature=0.0, logit_bias=bias)),
        ]
        masks = GrammarMasks.compute([0, 1, 2], matchers, vocab_size) if ahead else None
        chosen = sampler(logits, rows, masks).token_ids
        expected = logits.clone()
        for token_id, value in bias.items():
            expected[[2, 4], token_id] += value
        expected[:3].masked_fill_(truth.disallowed, float("-inf"))
        assert chosen == expected.argmax(-1).tolist()
        assert all(truth.allows(k, chosen[k]) for k in range(3))
        outcomes.add(chosen[1] == int(logits[1].argmax()))
    assert outcomes == {False}  # row 1's raw argmax was never taken
