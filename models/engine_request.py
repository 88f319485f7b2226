"""One request as the engine loop holds it: its sequence, detokenizer, sampling row and grammar.

Built on the caller's thread (`EngineRequest.build`, from `EngineCore.add_request`): a grammar is
compiled there (in the engine process, the thread that reads the pipe), so a new schema never
holds up the running batch's steps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from models.detokenizer import IncrementalDetokenizer
from models.grammar import GrammarCompiler, GrammarError
from models.sampler import SamplingRow, make_generator
from models.sampling_params import SamplingParams
from models.sequence import FinishReason, Sequence
from models.tokenizer import Tokenizer


@dataclass(slots=True)
class EngineRequest:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    row: SamplingRow
    last_token_time: float = 0.0  # engine clock, for the inter-token gaps
    # Why the request cannot run (its grammar failed to compile), answered when the loop takes it.
    refusal: str | None = None

    @classmethod
    def build(
        cls,
        seq: Sequence,
        tokenizer: Tokenizer,
        grammars: GrammarCompiler,
        device: torch.device,
    ) -> EngineRequest:
        params: SamplingParams = seq.params
        generator = make_generator(params.seed, device) if params.seed is not None else None
        decode = tokenizer.decode
        if params.keep_special_ids:
            decode = functools.partial(tokenizer.decode_keeping, keep=frozenset(params.keep_special_ids))
        detokenizer = IncrementalDetokenizer(decode, seq.prompt_token_ids, params.stop)
        request = cls(seq, detokenizer, SamplingRow(params, generator, seq.output_token_ids))
        if params.grammar is not None:
            try:
                request.row.matcher = grammars.matcher(params.grammar)
            except GrammarError as exc:
                request.refusal = f"the response format cannot be enforced: {exc}"
        return request

    def follow_grammar(self, token_id: int) -> tuple[FinishReason | None, str | None]:
        """Advance the grammar by the sampled token: (STOP, None) once the document is complete,
        so the request ends without a step spent on the end-of-sequence token; (ERROR, why) if
        the grammar rejects it; (None, None) otherwise, and always without a grammar."""
        matcher = self.row.matcher
        if matcher is None:
            return None, None
        if not matcher.consume_token(token_id):
            return FinishReason.ERROR, f"the grammar rejected a token: {matcher.get_error()}"
        return (FinishReason.STOP if matcher.is_stopped() else None), None
