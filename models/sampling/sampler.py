"""The engine's per-step sampler: one step's logits in, one next token per sequence out.

Owns logit processing (logit_bias, presence/frequency penalties, grammar masks, temperature,
top-k, top-p), the random draw, and the logprobs the API reports. It knows nothing of HTTP, tokenizers or the
scheduler: the engine hands it one `SamplingRow` per sequence and gets plain Python values back.

Deliberate choices (timings: one CPU thread, 32 rows):
- NOTE: a sampled row draws ONE uniform number and inverts its cumulative distribution
  (`searchsorted` over a `cumsum`), rather than racing Exponential(1) noise over its candidates.
  torch's CPU `exponential_` costs milliseconds at a large vocabulary, while the cumsum that
  top-p needs anyway makes the inverse CDF nearly free (docs/engine.md, measurements). One number per row also makes a
  seeded row's draw independent of the other rows in the batch by construction.
- NOTE: top-p without top-k never sorts the vocabulary (a full sort costs milliseconds a row).
  It draws from the whole distribution and rejects draws outside the nucleus; a rejected draw's
  probability is a floor under which the nucleus cannot lie, so the redraw is from a strictly
  smaller set (FlashInfer's pivot idea). At most 1 - top_p of first draws are rejected, and a
  probable draw is accepted without the exact test.
- Top-k calls `topk(k)` once per distinct k in the step, so a row's candidates (and their order
  among tied logits) never depend on what else is in the batch.
- Each row's logits are copied at most once per step: on CPU, large fresh allocations cost page
  faults worth about as much as the arithmetic at 151936 columns.
- Logprobs describe the model's raw distribution (log_softmax of the unprocessed logits), as
  vLLM does by default, and are computed only for rows that ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from llguidance import LLMatcher

from models.grammar.masks import GrammarMasks
from models.sampling.logprobs import TokenLogprob
from models.sampling.params import SamplingParams

# A nucleus rejection redraws from a set at least one token smaller, and in practice about half
# the mass smaller, so a handful of rounds suffice; the cap only bounds pathological cases.
MAX_NUCLEUS_ROUNDS = 32


@dataclass(slots=True)
class SamplingRow:
    """One sequence that needs a next token this step; built by the engine."""

    params: SamplingParams
    # Set iff params.seed is not None; owned by the sequence, so it advances across steps.
    generator: torch.Generator | None = None
    # Tokens generated so far: presence/frequency penalties count over these (not the prompt).
    output_token_ids: list[int] = field(default_factory=list)
    # Set iff params.grammar is not None: the sequence's grammar state (models/grammar/compiler.py), which
    # the engine advances with each sampled token. The sampler only reads its mask.
    matcher: LLMatcher | None = None
    # params.logit_bias as (token ids, biases) on the device, within the vocabulary: built on the
    # row's first step, so a step's cost does not grow with the number of entries.
    bias: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(frozen=True, slots=True)
class SampleResult:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprob | None]  # one per row; None where params.logprobs is None
    mask_seconds: float = 0.0  # spent computing the grammar masks (0 when no row has a grammar)


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    """A sequence's own generator. Any Python int is a valid seed: it is taken modulo 2**64."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return generator


def _argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (ties: the first index; NaN counts as the largest, as in torch).

    On the CPU through numpy: torch's CPU argmax over a batch of float32 logits takes many times
    numpy's, and this is on every greedy step (docs/engine.md, measurements). numpy has no
    bfloat16: other dtypes, and GPUs, stay with torch."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return list(logits.numpy().argmax(-1).tolist())
    return list(logits.argmax(-1).tolist())


class Sampler:
    """Called once per engine step, from the engine's thread; holds no state between steps."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        """vocab_size is the width of the logits (the model's vocabulary, which may be padded
        past the tokenizer's); every column is a token. device is where the logits live, and so
        where seeded rows' generators must be made (`make_generator(seed, sampler.device)`)."""
        if vocab_size < 1:
            raise ValueError("vocab_size must be positive")
        self.vocab_size = vocab_size
        self.device = device

    def __call__(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], masks: GrammarMasks | None = None
    ) -> SampleResult:
        """logits: (B, V) of any float dtype, row i belonging to rows[i]. Never modified.

        masks: the step's grammar masks, when the engine computed them ahead (models/grammar/masks.py);
        computed here when a row has a matcher and they are not given."""
        if logits.dim() != 2 or logits.shape[0] != len(rows) or logits.shape[1] != self.vocab_size:
            raise ValueError(f"expected logits of shape ({len(rows)}, {self.vocab_size}), got {tuple(logits.shape)}")
        if all(_is_plain_greedy(row) for row in rows):
            # The common case pays for one argmax and one device-to-host copy.
            return SampleResult(_argmax_rows(logits), [None] * len(rows))

        if masks is None:
            constrained = [i for i, row in enumerate(rows) if row.matcher is not None]
            if constrained:
                matchers = [rows[i].matcher for i in constrained]
                masks = GrammarMasks.compute(constrained, matchers, self.vocab_size)  # type: ignore[arg-type]
        chosen = [0] * len(rows)
        raw_greedy: list[int] = []  # greedy rows whose logits nothing changes but a grammar
        greedy: list[int] = []  # greedy rows with a bias or penalties
        by_top_k: dict[int, list[int]] = {}  # 0: no top-k (whole vocabulary)
        for i, row in enumerate(rows):
            if row.params.is_greedy:
                plain = not row.params.logit_bias and not (row.params.has_penalties and row.output_token_ids)
                (raw_greedy if plain else greedy).append(i)
            else:
                top_k = row.params.top_k if row.params.top_k < self.vocab_size else 0
                by_top_k.setdefault(top_k, []).append(i)
        if raw_greedy:
            greedy += self._raw_argmax(logits, raw_greedy, masks, chosen)
            greedy.sort()
        if greedy:
            x = _group_logits(logits, rows, greedy, masks, private=False)  # (g, V)
            for i, token_id in zip(greedy, _argmax_rows(x), strict=True):
                chosen[i] = token_id
        for top_k, group in by_top_k.items():
            # Only the whole-vocabulary path works in place, so only it needs a private copy.
            x = _group_logits(logits, rows, group, masks, private=top_k == 0)  # (n, V)
            sampled = _sample_group(x, top_k, [rows[i] for i in group]).tolist()
            for i, token_id in zip(group, sampled, strict=True):
                chosen[i] = token_id
        seconds = masks.seconds if masks is not None else 0.0
        return SampleResult(chosen, _logprobs(logits, rows, chosen), seconds)

    @staticmethod
    def _raw_argmax(logits: torch.Tensor, group: list[int], masks: GrammarMasks | None, chosen: list[int]) -> list[int]:
        """Writes each row's argmax into `chosen`; returns the rows whose grammar forbids it.

        NOTE: the raw argmax is the masked one whenever the grammar allows it (every token before
        it is smaller), and testing one bit is far cheaper than masking a row of logits; only
        the rows it fails for go through the mask."""
        mask_of = {row: k for k, row in enumerate(masks.rows)} if masks is not None else {}
        redo = []
        if 2 * len(group) >= logits.shape[0]:  # cheaper to read every row than to copy the group's
            every = _argmax_rows(logits)
            argmax = [every[i] for i in group]
        else:
            argmax = _argmax_rows(_take_rows(logits, group))
        for i, token_id in zip(group, argmax, strict=True):
            k = mask_of.get(i)
            if k is not None and not masks.allows(k, token_id):  # type: ignore[union-attr]
                redo.append(i)
            else:
                chosen[i] = token_id
        return redo


def _is_plain_greedy(row: SamplingRow) -> bool:
    params = row.params
    return (
        params.is_greedy
        and row.matcher is None
        and not params.logit_bias
        and not params.has_penalties
        and params.logprobs is None
    )


def _index(positions: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(positions, dtype=torch.long, device=device)


def _take_rows(x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """x's rows at `positions` (sorted, distinct); x itself, uncopied, when that is every row."""
    if len(positions) == x.shape[0]:
        return x
    return x.index_select(0, _index(positions, x.device))


def _group_logits(
    logits: torch.Tensor, rows: Sequence[SamplingRow], group: list[int], masks: GrammarMasks | None, *, private: bool
) -> torch.Tensor:
    """(n, V) float32 logits of the rows at `group`, after logit_bias and penalties (OpenAI's
    order), then the grammar masks: a forbidden token is -inf whatever its bias.

    A private copy when `private`, or when something had to be applied; otherwise possibly
    `logits` itself, so read-only. Either way each row is copied at most once.
    """
    group_rows = [rows[i] for i in group]
    has_bias = any(row.params.logit_bias for row in group_rows)
    has_penalties = any(row.params.has_penalties and row.output_token_ids for row in group_rows)
    has_masks = masks is not None and masks.covers(group)
    x = _take_rows(logits, group)
    copied = x is not logits
    x = x.to(torch.float32, copy=not copied and (private or has_bias or has_penalties or has_masks))
    if has_bias:
        _add_logit_bias(x, group_rows)
    if has_penalties:
        _apply_penalties(x, group_rows)
    if has_masks:
        masks.apply(x, group)  # type: ignore[union-attr]
    return x


def _add_logit_bias(x: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Adds rows[i]'s logit_bias to x[i], in place. x: (n, V)"""
    row_ids, token_ids, biases = [], [], []
    for i, row in enumerate(rows):
        if not row.params.logit_bias:
            continue
        if row.bias is None:
            row.bias = _bias_tensors(row.params.logit_bias, x.shape[1], x.device)
        ids, values = row.bias
        row_ids.append(torch.full_like(ids, i))
        token_ids.append(ids)
        biases.append(values)
    if row_ids:
        index = (torch.cat(row_ids), torch.cat(token_ids))
        x.index_put_(index, torch.cat(biases).to(x.dtype), accumulate=True)


def _bias_tensors(
    logit_bias: dict[int, float], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    # NOTE: ids outside the logits are ignored, not raised: one request's bad id must not fail
    # the whole batch. The API layer is where a 400 for them belongs.
    kept = [(token_id, bias) for token_id, bias in logit_bias.items() if 0 <= token_id < vocab_size]
    ids = torch.tensor([token_id for token_id, _ in kept], dtype=torch.long, device=device)
    return ids, torch.tensor([bias for _, bias in kept], dtype=torch.float32, device=device)


def _apply_penalties(x: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """OpenAI's penalties for rows[i], in place on x[i]. x: (n, V)
    logit[t] -= presence * (count[t] > 0) + frequency * count[t], counting the row's output tokens.

    Counts come from one `unique` over (row, token) keys, so cost follows the number of output
    tokens, not B * V.
    """
    vocab_size = x.shape[1]
    penalised = [i for i, row in enumerate(rows) if row.params.has_penalties and row.output_token_ids]
    output_ids = torch.tensor(
        [t for i in penalised for t in rows[i].output_token_ids], dtype=torch.long, device=x.device
    )  # (N,)
    lengths = _index([len(rows[i].output_token_ids) for i in penalised], x.device)
    row_of = torch.repeat_interleave(_index(penalised, x.device), lengths)  # (N,)
    keys, counts = torch.unique(row_of * vocab_size + output_ids, return_counts=True)  # (U,)
    row_ids = keys // vocab_size
    presence = torch.tensor([row.params.presence_penalty for row in rows], device=x.device)  # (n,)
    frequency = torch.tensor([row.params.frequency_penalty for row in rows], device=x.device)  # (n,)
    penalty = presence[row_ids] + frequency[row_ids] * counts  # (U,)
    x.index_put_((row_ids, keys % vocab_size), -penalty.to(x.dtype), accumulate=True)


def _sample_group(x: torch.Tensor, top_k: int, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Samples one token per row of x (n, V), all rows sharing top_k (0: off). (n,)"""
    temperature = torch.tensor([row.params.temperature for row in rows], device=x.device)[:, None]  # (n, 1)
    top_p = torch.tensor([row.params.top_p for row in rows], device=x.device)  # (n,)
    generators = [row.generator for row in rows]
    if top_k:
        return _sample_top_k(x, temperature, top_k, top_p, generators)
    return _sample_nucleus(x, temperature, top_p, generators)


def _draw_uniform(generators: Sequence[torch.Generator | None], device: torch.device) -> torch.Tensor:
    """One U[0, 1) number per row. (n,)

    Unseeded rows share one batched draw; a seeded row draws exactly one number from its own
    generator, so its stream never depends on which rows share the step, or where it sits.
    """
    u = torch.rand(len(generators), device=device)
    for i, generator in enumerate(generators):
        if generator is not None:
            u[i] = torch.rand((), generator=generator, device=device)
    return u


def _inverse_cdf(cumulative: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first column where each row's cumulative mass (n, C), unnormalised, exceeds u * total.

    Never a column of zero weight: for u < 1, u * total rounds below total (float multiply by
    a number under 1 never rounds up to the other factor), so some weighted column exceeds it. (n,)
    """
    target = u[:, None] * cumulative[:, -1:]  # (n, 1)
    return torch.searchsorted(cumulative, target, right=True).squeeze(1)


def _sample_top_k(
    x: torch.Tensor,
    temperature: torch.Tensor,
    top_k: int,
    top_p: torch.Tensor,
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """Top-k, then top-p within the top k (renormalised, as vLLM and HF do), then a draw. (n,)"""
    # Dividing by a positive temperature keeps the order, so only the k winners are scaled.
    values, token_ids = x.topk(top_k)  # (n, k) best first
    weights = values.sub(values[:, :1]).div_(temperature).exp_()  # (n, k) unnormalised probs, first is 1
    cumulative = weights.cumsum(-1)  # (n, k)
    threshold = top_p[:, None] * cumulative[:, -1:]  # (n, 1)
    # The nucleus is the shortest prefix reaching top_p: keep a column while the mass before it
    # is short of the threshold. The first column is always kept.
    num_kept = 1 + (cumulative[:, :-1] < threshold).sum(-1, keepdim=True)  # (n, 1)
    columns = torch.arange(top_k, device=x.device)  # (k,)
    # Flatten the cumulative mass past the nucleus so the draw cannot land there.
    cumulative = torch.where(columns < num_kept, cumulative, cumulative.gather(1, num_kept - 1))
    chosen = _inverse_cdf(cumulative, _draw_uniform(generators, x.device))  # (n,)
    return token_ids.gather(1, chosen[:, None]).squeeze(1)


def _sample_nucleus(
    x: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """A draw from the whole vocabulary, restricted to the top-p nucleus where top_p < 1. (n,)

    x (n, V) is overwritten. Token t is in the nucleus iff the mass of tokens strictly more
    probable than t is short of top_p; unlike the top-k path's shortest prefix, tokens tied in
    probability are thus all in or all out. Drawing from the whole distribution and keeping only
    nucleus samples is exactly a draw from the renormalised nucleus.
    """
    # amax, not max: no indices needed, and several times faster on CPU.
    weights = x.sub_(x.amax(-1, keepdim=True)).div_(temperature).exp_()  # (n, V) unnormalised, max 1
    cumulative = weights.cumsum(-1)  # (n, V)
    tokens = _inverse_cdf(cumulative, _draw_uniform(generators, x.device))  # (n,)
    total = cumulative[:, -1]  # (n,)
    threshold = top_p * total  # (n,)
    sampled = weights.gather(1, tokens[:, None]).squeeze(1)  # (n,) each sample's weight
    # The mass above t is at most total - p(t): a probable enough sample needs no exact test.
    maybe_outside = (top_p < 1.0) & (total - sampled >= threshold)  # (n,)
    pending: list[int] = maybe_outside.nonzero().squeeze(1).tolist()
    scratch = torch.empty_like(weights[0])  # (V,)
    for _ in range(MAX_NUCLEUS_ROUNDS):
        if not pending:
            return tokens
        # NOTE: a per-row threshold (keep what is strictly above the floor) is several times faster
        # on CPU than one batched multiply by a comparison mask, and its sum cannot depend on
        # which other rows are pending.
        floors = sampled[pending].tolist()
        mass_above = torch.stack(
            [torch.threshold(weights[i], f, 0.0, out=scratch).sum() for i, f in zip(pending, floors, strict=True)]
        )
        # Nothing above it: the most probable token, always in the nucleus, even where top_p is
        # so small that it is 0 in float32 (a threshold of 0 rejected it, and the redraw from an
        # empty "above" indexed past the vocabulary).
        is_outside = ((mass_above >= threshold[pending]) & (mass_above > 0)).tolist()
        rejected = [(i, f) for i, f, outside in zip(pending, floors, is_outside, strict=True) if outside]
        if not rejected:
            return tokens
        # The nucleus lies strictly above a rejected sample: redraw from there only.
        pending = [i for i, _ in rejected]
        above = torch.stack([torch.threshold(weights[i], f, 0.0) for i, f in rejected])  # (r, V)
        uniform = _draw_uniform([generators[i] for i in pending], x.device)
        redrawn = _inverse_cdf(above.cumsum(-1), uniform)  # (r,)
        index = _index(pending, x.device)
        tokens[index] = redrawn
        sampled[index] = above.gather(1, redrawn[:, None]).squeeze(1)
    # NOTE: not reached in practice; should it be, the most probable token is always in the nucleus.
    tokens[_index(pending, x.device)] = weights[pending].argmax(-1)
    return tokens


def _logprobs(logits: torch.Tensor, rows: Sequence[SamplingRow], token_ids: list[int]) -> list[TokenLogprob | None]:
    """The chosen token's logprob and the top alternatives under the RAW logits, per row."""
    result: list[TokenLogprob | None] = [None] * len(rows)
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    if not wanted:
        return result
    logprobs = _take_rows(logits, wanted).log_softmax(-1, dtype=torch.float32)  # (L, V)
    tokens = _index([token_ids[i] for i in wanted], logits.device)  # (L,)
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
    num_top = max(rows[i].params.logprobs or 0 for i in wanted)
    top_values: list[list[float]] = [[] for _ in wanted]
    top_ids: list[list[int]] = [[] for _ in wanted]
    if num_top:
        values, ids = logprobs.topk(num_top)  # (L, num_top) best first
        top_values, top_ids = values.tolist(), ids.tolist()
    for j, i in enumerate(wanted):
        n = rows[i].params.logprobs or 0
        top = tuple(zip(top_ids[j][:n], top_values[j][:n], strict=True))
        result[i] = TokenLogprob(token_ids[i], chosen[j], top)
    return result
