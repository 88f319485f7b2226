"""Unit tests for the sampler: made-up logits, no model, no timings."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from models.sampling.params import SamplingParams
from models.sampling.sampler import Sampler, SampleResult, SamplingRow, _inverse_cdf, make_generator

CPU = torch.device("cpu")


def params(**fields: object) -> SamplingParams:
    return SamplingParams(max_tokens=16, **fields)  # type: ignore[arg-type]


def row(output_token_ids: list[int] | None = None, **fields: object) -> SamplingRow:
    p = params(**fields)
    generator = make_generator(p.seed, CPU) if p.seed is not None else None
    return SamplingRow(p, generator, list(output_token_ids or []))


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
    return Sampler(logits.shape[1], CPU)(logits, rows)


def random_logits(batch: int, vocab: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def nucleus(probs: torch.Tensor, top_p: float) -> set[int]:
    """Reference top-p by full sort: the shortest prefix of the sorted probs reaching top_p."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(0) - sorted_probs
    return set(order[mass_before < top_p].tolist())


def frequencies(logits: torch.Tensor, rows: list[SamplingRow], num_draws: int) -> Counter[int]:
    """Samples one row spec num_draws times, batched."""
    assert len(rows) == 1
    batch = logits.expand(num_draws, -1)
    return Counter(sample(batch, rows * num_draws).token_ids)


# --- greedy ---------------------------------------------------------------------------------


def test_greedy_is_argmax_and_returns_python_ints() -> None:
    logits = random_logits(5, 300, seed=0)
    result = sample(logits, [row(temperature=0.0) for _ in range(5)])
    assert result.token_ids == logits.argmax(-1).tolist()
    assert all(type(t) is int for t in result.token_ids)
    assert result.logprobs == [None] * 5


@pytest.mark.parametrize("temperature", [7.667291814971508e-134, 1e-45, 1e-30, 9e-6])
def test_a_temperature_too_small_for_float32_samples_greedily(temperature: float) -> None:
    """Regression (schemathesis, tests/app/test_openapi_fuzz.py): temperature 7.7e-134 is valid
    OpenAI input, but as a float32 divisor it is 0, the weights were NaN, the draw returned token
    8192 of 8192 and the request got a 500. Below GREEDY_TEMPERATURE a row is greedy, as in vLLM."""
    logits = random_logits(3, 8192, seed=7)
    rows = [row(temperature=temperature), row(temperature=temperature, top_p=0.5), row(temperature=temperature, seed=1)]
    assert all(r.params.is_greedy for r in rows)
    assert sample(logits.clone(), rows).token_ids == logits.argmax(-1).tolist()


def test_greedy_matches_torch_on_ties_nan_and_strided_logits() -> None:
    # The CPU fast path goes through numpy (models/sampling/sampler.py _argmax_rows): torch's own choices.
    logits = random_logits(6, 300, seed=3)
    logits[1] = 0.0  # all tied: the first index
    logits[2, 17] = logits[2, 250] = 1e6  # a tie for the maximum
    logits[3, 42] = float("nan")  # NaN counts as the largest
    with torch.inference_mode():  # as the engine's logits are made
        inference = logits.clone()
    for x in (logits, inference, logits[::2], logits[:, :200]):
        assert sample(x, [row(temperature=0.0) for _ in range(x.shape[0])]).token_ids == x.argmax(-1).tolist()


def test_greedy_accepts_half_precision_logits() -> None:
    logits = random_logits(3, 300, seed=1)
    result = sample(logits.to(torch.bfloat16), [row(temperature=0.0) for _ in range(3)])
    assert result.token_ids == logits.to(torch.bfloat16).argmax(-1).tolist()


def test_greedy_on_the_general_path_is_argmax() -> None:
    # logprobs force the general path; the choice must not change.
    logits = random_logits(4, 300, seed=2)
    result = sample(logits, [row(temperature=0.0, logprobs=1) for _ in range(4)])
    assert result.token_ids == logits.argmax(-1).tolist()


def test_empty_batch() -> None:
    assert sample(torch.empty(0, 10), []) == SampleResult([], [])


def test_wrong_logits_shape_is_rejected() -> None:
    sampler = Sampler(100, CPU)
    with pytest.raises(ValueError, match="shape"):
        sampler(torch.zeros(2, 99), [row(temperature=0.0), row(temperature=0.0)])
    with pytest.raises(ValueError, match="shape"):
        sampler(torch.zeros(3, 100), [row(temperature=0.0)])


@pytest.mark.parametrize(
    "specs",
    [
        [{"temperature": 1.0}, {"temperature": 0.5, "top_p": 0.3}],  # whole-vocabulary path, no copy needed
        [{"temperature": 1.0, "top_k": 5}, {"temperature": 0.0, "logprobs": 3}],
        [
            {"temperature": 0.9, "presence_penalty": 1.0, "frequency_penalty": 1.0, "logit_bias": {3: 5.0}},
            {"temperature": 0.0, "logit_bias": {4: -5.0}, "logprobs": 2},
        ],
    ],
)
def test_logits_are_not_modified(specs: list[dict[str, object]]) -> None:
    logits = random_logits(2, 50, seed=3)
    before = logits.clone()
    sample(logits, [row([1, 1, 2], **spec) for spec in specs])
    assert torch.equal(logits, before)


# --- seeds --------------------------------------------------------------------------------


SEEDED_SPECS = [
    {"temperature": 1.0},
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 1.3, "top_k": 20},
    {"temperature": 1.0, "top_k": 30, "top_p": 0.7},
]


def run_steps(logit_steps: list[torch.Tensor], rows: list[SamplingRow], position: int) -> list[int]:
    """Samples several steps, advancing each row's generator; returns rows[position]'s tokens."""
    return [sample(logits, rows).token_ids[position] for logits in logit_steps]


@pytest.mark.parametrize("spec", SEEDED_SPECS)
def test_same_seed_same_tokens(spec: dict[str, object]) -> None:
    steps = [random_logits(1, 500, seed=s) for s in range(8)]
    first = run_steps(steps, [row(seed=1234, **spec)], 0)
    again = run_steps(steps, [row(seed=1234, **spec)], 0)
    other = run_steps(steps, [row(seed=4321, **spec)], 0)
    assert first == again
    assert first != other  # 8 draws from a broad distribution: a clash is vanishingly unlikely


@pytest.mark.parametrize("spec", SEEDED_SPECS)
@pytest.mark.parametrize("position", [0, 2, 5])
def test_seeded_row_ignores_batch_composition_and_position(spec: dict[str, object], position: int) -> None:
    vocab = 500
    steps = [random_logits(1, vocab, seed=s) for s in range(6)]
    alone = run_steps(steps, [row(seed=99, **spec)], 0)

    neighbours = [
        row(temperature=0.0),
        row(temperature=1.0),  # unseeded: uses the shared draw
        row(seed=7, temperature=0.7, top_p=0.5),
        row(temperature=1.0, top_k=3, logprobs=2),
        row([1, 2, 3], seed=8, temperature=1.5, top_k=200, presence_penalty=1.0),
    ]
    batch_rows = [*neighbours[:position], row(seed=99, **spec), *neighbours[position:]]
    # Other rows see different logits, so nothing can line up by accident.
    batched_steps = []
    for s, logits in enumerate(steps):
        batch = random_logits(len(batch_rows), vocab, seed=1000 + s)
        batch[position] = logits[0]
        batched_steps.append(batch)
    assert run_steps(batched_steps, batch_rows, position) == alone


def test_make_generator_accepts_any_int_seed() -> None:
    for seed in (0, -1, 2**64 + 5, -(2**70)):
        make_generator(seed, CPU)
    a = torch.rand(3, generator=make_generator(-1, CPU))
    b = torch.rand(3, generator=make_generator(2**64 - 1, CPU))
    assert torch.equal(a, b)


# --- top-k and top-p -----------------------------------------------------------------------


def test_top_k_one_is_greedy() -> None:
    logits = random_logits(16, 400, seed=4)
    result = sample(logits, [row(temperature=1.5, top_k=1) for _ in range(16)])
    assert result.token_ids == logits.argmax(-1).tolist()


@pytest.mark.parametrize("top_p", [1e-6, 7.66e-125])  # the second is 0 in float32
@pytest.mark.parametrize("top_k", [0, 50])
def test_tiny_top_p_is_greedy(top_k: int, top_p: float) -> None:
    """Found by the API fuzzer: top_p 7.66e-125 (0 in float32) rejected even the most probable
    token and redrew from nothing, indexing past the vocabulary: a 500."""
    logits = random_logits(16, 400, seed=5)
    result = sample(logits, [row(temperature=1.5, top_p=top_p, top_k=top_k) for _ in range(16)])
    assert result.token_ids == logits.argmax(-1).tolist()


def test_top_k_restricts_support_to_the_k_best() -> None:
    torch.manual_seed(0)
    logits = random_logits(1, 300, seed=6, scale=0.3)  # flat: without top-k, many tokens appear
    allowed = set(logits[0].topk(7).indices.tolist())
    seen = frequencies(logits, [row(temperature=2.0, top_k=7)], 3000)
    assert set(seen) == allowed  # every one of the k appears, nothing else does


def test_top_k_larger_than_vocab_is_no_restriction() -> None:
    torch.manual_seed(0)
    logits = torch.zeros(1, 5)
    seen = frequencies(logits, [row(temperature=1.0, top_k=10)], 500)
    assert set(seen) == set(range(5))


# probabilities 0.4, 0.3, 0.2 on three tokens, 0.1 spread over the other 997.
def peaked_logits() -> torch.Tensor:
    probs = torch.full((1000,), 0.1 / 997)
    probs[[3, 10, 20]] = torch.tensor([0.4, 0.3, 0.2])
    return probs.log()[None, :]


@pytest.mark.parametrize("top_k", [0, 100])
def test_top_p_distribution(top_k: int) -> None:
    # The nucleus for top_p=0.85 is {3, 10, 20}: 0.7 lies before token 20, 0.9 before the next.
    torch.manual_seed(0)
    seen = frequencies(peaked_logits(), [row(temperature=1.0, top_p=0.85, top_k=top_k)], 20_000)
    assert set(seen) == {3, 10, 20}
    for token, expected in ((3, 0.4 / 0.9), (10, 0.3 / 0.9), (20, 0.2 / 0.9)):
        assert seen[token] / 20_000 == pytest.approx(expected, abs=0.02)


@pytest.mark.parametrize("top_k", [0, 4])
def test_distribution_matches_softmax_with_temperature(top_k: int) -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]])
    seen = frequencies(logits, [row(temperature=0.5, top_k=top_k)], 20_000)
    expected = (logits[0] / 0.5).softmax(-1).tolist()
    for token in range(4):
        assert seen[token] / 20_000 == pytest.approx(expected[token], abs=0.015)


def test_top_p_with_top_k_keeps_the_shortest_prefix_reaching_top_p() -> None:
    # Four equal tokens in the top 4: two make exactly half their mass, so top_p=0.5 keeps two.
    torch.manual_seed(0)
    logits = torch.tensor([[0.0, 0.0, -30.0, 0.0, 0.0]])
    seen = frequencies(logits, [row(temperature=1.0, top_k=4, top_p=0.5)], 500)
    assert len(seen) == 2 and 2 not in seen


def test_top_p_without_top_k_keeps_every_token_tied_at_the_boundary() -> None:
    # NOTE: documents a deliberate difference: the full-vocabulary path decides by probability,
    # not by position, so tokens of equal probability are all in or all out.
    torch.manual_seed(0)
    seen = frequencies(torch.zeros(1, 4), [row(temperature=1.0, top_p=0.5)], 500)
    assert set(seen) == {0, 1, 2, 3}


def test_inverse_cdf_never_lands_on_a_weightless_column() -> None:
    # The largest u below 1 must stay on the last weighted column, whatever the total.
    largest_u = torch.tensor([1.0 - 2.0**-24])
    for total in (1.0, 2.0, 3.0, 1.5, 12345.678, 2.0**-30):
        cumulative = torch.tensor([[total / 4, total, total, total]])
        assert _inverse_cdf(cumulative, largest_u).tolist() == [1]
    assert _inverse_cdf(torch.tensor([[0.0, 1.0, 1.0]]), torch.tensor([0.0])).tolist() == [1]


@pytest.mark.parametrize("top_p", [0.02, 0.3, 0.9])
@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0])
def test_top_p_never_samples_outside_the_nucleus(top_p: float, scale: float) -> None:
    # Flat to peaked distributions, including ones where most samples need a redraw.
    torch.manual_seed(0)
    logits = random_logits(1, 2000, seed=7, scale=scale)
    allowed = nucleus(logits[0].softmax(-1), top_p)
    seen = frequencies(logits, [row(temperature=1.0, top_p=top_p)], 2000)
    assert set(seen) <= allowed
    if len(allowed) <= 20:
        assert set(seen) == allowed  # and every member can come up


# --- logit_bias and penalties ----------------------------------------------------------------


def test_logit_bias_plus_100_forces_a_token() -> None:
    logits = random_logits(3, 300, seed=8)
    rows = [
        row(temperature=0.0, logit_bias={17: 100.0}),
        row(temperature=1.0, logit_bias={42: 100.0}),
        row(temperature=1.0, top_k=5, logit_bias={99: 100.0}),
    ]
    assert sample(logits, rows).token_ids == [17, 42, 99]


def test_logit_bias_minus_100_bans_a_token() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0]])
    greedy = sample(logits, [row(temperature=0.0, logit_bias={0: -100.0})])
    assert greedy.token_ids == [1]
    seen = frequencies(logits, [row(temperature=1.0, logit_bias={0: -100.0})], 2000)
    assert 0 not in seen and seen[1] > 0


def test_logit_bias_outside_the_vocabulary_is_ignored() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.0]])
    assert sample(logits, [row(temperature=0.0, logit_bias={3: 100.0, -1: 100.0})]).token_ids == [1]


def test_presence_penalty_flips_the_argmax() -> None:
    logits = torch.tensor([[2.0, 1.5, 0.0]])
    # 2.0 - 1.0 * (count > 0) = 1.0 < 1.5
    assert sample(logits, [row([0], temperature=0.0, presence_penalty=1.0)]).token_ids == [1]
    # A penalty only on tokens not generated changes nothing.
    assert sample(logits, [row([2, 2], temperature=0.0, presence_penalty=1.0)]).token_ids == [0]


def test_frequency_penalty_scales_with_the_count() -> None:
    logits = torch.tensor([[2.0, 1.5, 0.0]])
    # 2.0 - 0.2 * 1 = 1.8 > 1.5, but 2.0 - 0.2 * 3 = 1.4 < 1.5
    assert sample(logits, [row([0], temperature=0.0, frequency_penalty=0.2)]).token_ids == [0]
    assert sample(logits, [row([0, 0, 0], temperature=0.0, frequency_penalty=0.2)]).token_ids == [1]


def test_presence_and_frequency_penalties_add_up() -> None:
    logits = torch.tensor([[2.0, 1.15, 0.0]])
    # 2.0 - (0.5 + 0.2 * 2) = 1.1 < 1.15; either penalty alone leaves token 0 on top.
    both = row([0, 0], temperature=0.0, presence_penalty=0.5, frequency_penalty=0.2)
    assert sample(logits, [both]).token_ids == [1]
    assert sample(logits, [row([0, 0], temperature=0.0, presence_penalty=0.5)]).token_ids == [0]
    assert sample(logits, [row([0, 0], temperature=0.0, frequency_penalty=0.2)]).token_ids == [0]


def test_negative_penalty_encourages_repeats() -> None:
    logits = torch.tensor([[2.0, 1.5, 0.5]])
    # 0.5 + 2.0 = 2.5 > 2.0
    assert sample(logits, [row([2], temperature=0.0, presence_penalty=-2.0)]).token_ids == [2]


def test_penalties_apply_only_to_their_own_row() -> None:
    logits = torch.tensor([[2.0, 1.5, 0.5]]).expand(3, -1)
    rows = [
        row([1], temperature=0.0),  # a history, but no penalty
        row([0], temperature=0.0, presence_penalty=1.0),  # 1.0, 1.5, 0.5
        row([0, 1], temperature=0.0, frequency_penalty=2.0),  # 0.0, -0.5, 0.5
    ]
    assert sample(logits, rows).token_ids == [0, 1, 2]


# --- logprobs ------------------------------------------------------------------------------


def test_logprobs_describe_the_raw_distribution() -> None:
    logits = random_logits(2, 300, seed=9)
    rows = [
        row([5, 5], temperature=0.0, logprobs=5, logit_bias={7: 100.0}, presence_penalty=2.0),
        row(temperature=0.7, top_k=10, logprobs=3, seed=1),
    ]
    result = sample(logits, rows)
    raw = logits.log_softmax(-1)
    assert result.token_ids[0] == 7  # the bias decided the choice ...
    for i, n in enumerate((5, 3)):
        entry = result.logprobs[i]
        assert entry is not None
        token = result.token_ids[i]
        assert entry.token_id == token
        # ... but logprobs ignore bias, penalties and temperature.
        assert entry.logprob == pytest.approx(raw[i, token].item(), abs=1e-5)
        expected = raw[i].topk(n)
        assert [t for t, _ in entry.top] == expected.indices.tolist()
        assert [lp for _, lp in entry.top] == pytest.approx(expected.values.tolist(), abs=1e-5)
        assert all(type(t) is int and type(lp) is float for t, lp in entry.top)
        assert type(entry.logprob) is float


def test_top_logprobs_are_sorted_best_first_with_the_requested_length() -> None:
    logits = random_logits(3, 1000, seed=10)
    result = sample(logits, [row(temperature=1.0, logprobs=n) for n in (20, 1, 7)])
    for entry, n in zip(result.logprobs, (20, 1, 7), strict=True):
        assert entry is not None
        values = [lp for _, lp in entry.top]
        assert len(values) == n
        assert values == sorted(values, reverse=True)
        assert math.fsum(math.exp(v) for v in values) <= 1.0 + 1e-6


def test_logprobs_zero_gives_the_chosen_token_only() -> None:
    logits = random_logits(2, 100, seed=11)
    result = sample(logits, [row(temperature=0.0, logprobs=0), row(temperature=0.0)])
    first = result.logprobs[0]
    assert first is not None and first.top == ()
    assert first.logprob == pytest.approx(logits[0].log_softmax(-1).max().item(), abs=1e-5)
    assert result.logprobs[1] is None


# --- mixed batches ---------------------------------------------------------------------------


def test_mixed_batch_gives_each_row_what_it_gets_alone() -> None:
    vocab = 400
    specs: list[tuple[list[int], dict[str, object]]] = [
        ([], {"temperature": 0.0}),
        ([3, 3], {"temperature": 0.0, "frequency_penalty": 1.5, "logprobs": 2}),
        ([], {"temperature": 0.9, "seed": 1, "top_p": 0.8, "logprobs": 4}),
        ([], {"temperature": 1.1, "seed": 2, "top_k": 5}),
        ([7], {"temperature": 0.6, "seed": 3, "logit_bias": {11: 3.0}, "presence_penalty": 0.5}),
        ([], {"temperature": 0.0, "logprobs": 0, "logit_bias": {1: -100.0}}),
    ]
    logits = random_logits(len(specs), vocab, seed=12)
    batched = sample(logits, [row(ids, **spec) for ids, spec in specs])
    for i, (ids, spec) in enumerate(specs):
        alone = sample(logits[i : i + 1], [row(ids, **spec)])
        assert batched.token_ids[i] == alone.token_ids[0]
        together, single = batched.logprobs[i], alone.logprobs[0]
        assert (together is None) == (single is None) == ("logprobs" not in spec)
        if together is not None and single is not None:
            assert together.token_id == single.token_id
            assert together.logprob == pytest.approx(single.logprob, abs=1e-6)
            assert [t for t, _ in together.top] == [t for t, _ in single.top]
