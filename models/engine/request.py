"""One request as the engine loop holds it: its sequence, detokenizer, sampling row and grammar.

Built on the caller's thread (`EngineRequest.build`, from `EngineCore.add_request`). Its grammar's
matcher is attached there when the grammar is compiled already, else on the grammar compiler's
own thread (`attach_grammar`), so a new schema holds up neither the running batch's steps nor the
thread that takes requests in (in the engine process, the one that reads the pipe).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from models.grammar.compiler import TOO_COMPLEX, GrammarCompiler, GrammarError, client_message
from models.loading.tokenizer import Tokenizer
from models.sampling.detokenizer import IncrementalDetokenizer
from models.sampling.params import SamplingParams
from models.sampling.sampler import SamplingRow, make_generator
from models.scheduler.sequence import FinishReason, Sequence


@dataclass(slots=True)
class EngineRequest:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    row: SamplingRow
    last_token_time: float = 0.0  # engine clock, for the inter-token gaps
    # Why the request cannot run (its grammar failed to compile), answered when the loop takes it.
    refusal: str | None = None

    @classmethod
    def build(cls, seq: Sequence, tokenizer: Tokenizer, device: torch.device) -> EngineRequest:
        """The request without its grammar's matcher: `attach_grammar` adds it."""
        params: SamplingParams = seq.params
        generator = make_generator(params.seed, device) if params.seed is not None else None
        decode = tokenizer.decode
        if params.keep_special_ids:
            decode = functools.partial(tokenizer.decode_keeping, keep=frozenset(params.keep_special_ids))
        detokenizer = IncrementalDetokenizer(decode, seq.prompt_token_ids, params.stop)
        return cls(seq, detokenizer, SamplingRow(params, generator, seq.output_token_ids))

    def attach_grammar(self, grammars: GrammarCompiler) -> EngineRequest:
        """Give the row its grammar's matcher (compiling the grammar unless cached for the
        sequence's scope), or set `refusal`; a no-op without a grammar."""
        grammar = self.seq.params.grammar
        if grammar is not None:
            try:
                self.row.matcher = grammars.matcher(grammar, self.seq.cache_scope)
            except GrammarError as exc:
                self.refusal = f"the response format cannot be enforced: {exc}"
        return self

    def follow_grammar(self, token_id: int) -> tuple[FinishReason | None, str | None]:
        """Advance the grammar by the sampled token: (STOP, None) once the document is complete,
        so the request ends without a step spent on the end-of-sequence token; (INVALID, why) if
        the grammar rejects it; (None, None) otherwise, and always without a grammar.

        NOTE: the sampler only ever picks a token the mask allows, so a rejection means the
        matcher could not compute the mask (a schema whose choices overflow the library's row
        bound): the client's schema, not the server, and a 4xx."""
        matcher = self.row.matcher
        if matcher is None:
            return None, None
        if not matcher.consume_token(token_id):
            message = client_message(matcher.get_error() or TOO_COMPLEX)
            return FinishReason.INVALID, f"the response format cannot be enforced: {message}"
        return (FinishReason.STOP if matcher.is_stopped() else None), None
