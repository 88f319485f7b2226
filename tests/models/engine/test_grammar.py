"""Constrained decoding through the engine on the real tiny model: every finished document
matches its schema at temperature 1, alongside unconstrained rows, with n > 1, seeds and max_tokens."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from models.grammar.compiler import json_schema_grammar
from models.sampling.params import SamplingParams
from models.scheduler.sequence import FinishReason
from tests.models.engine.test_core import EngineFactory, make_engine, prompt, run, tokens

__all__ = ["make_engine"]  # the fixture, used by name

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "rank": {"type": "integer", "minimum": 1, "maximum": 5},
        "kind": {"anyOf": [{"const": "town"}, {"type": "null"}]},
    },
    "required": ["city", "rank", "kind"],
    "additionalProperties": False,
}


def constrained(seed: int, max_tokens: int = 80, schema: dict[str, Any] = SCHEMA) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, grammar=json_schema_grammar(schema))


async def test_documents_match_the_schema_beside_free_rows(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=8)
    free = SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True)
    sequences = [(prompt(12, seed), constrained(seed) if seed % 2 else free) for seed in range(8)]
    outputs = await run(engine.submit(sequences))
    for seed, outs in enumerate(outputs):
        text = "".join(out.text for out in outs)
        if seed % 2:
            assert outs[-1].finish_reason is FinishReason.STOP, text
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            assert outs[-1].finish_reason is FinishReason.LENGTH and len(tokens(outs)) == 24


async def test_the_same_seed_writes_the_same_document(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=4)
    texts = []
    for _ in range(2):
        outputs = await run(engine.submit([(prompt(9, 1), constrained(11)), (prompt(9, 2), constrained(12))]))
        texts.append(["".join(out.text for out in outs) for outs in outputs])
    assert texts[0] == texts[1]
    assert texts[0][0] != texts[0][1]


async def test_max_tokens_cuts_a_document_with_length(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    (outs,) = await run(engine.submit([(prompt(5, 3), constrained(3, max_tokens=3))]))
    assert outs[-1].finish_reason is FinishReason.LENGTH
    assert len(tokens(outs)) == 3
    text = "".join(out.text for out in outs)
    assert text.startswith('{"city') and '{"city": "'[: len(text)] == text[:10], text


async def test_a_grammar_that_cannot_compile_is_an_error_not_a_free_reply(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    bad = SamplingParams(max_tokens=8, grammar=json_schema_grammar({"type": "array", "uniqueItems": True}))
    (outs,) = await run(engine.submit([(prompt(5, 4), bad)]))
    assert outs[-1].finish_reason is FinishReason.INVALID and not tokens(outs)
    assert outs[-1].error is not None and "uniqueItems" in outs[-1].error
    # The engine goes on serving.
    (outs,) = await run(engine.submit([(prompt(5, 5), constrained(5))]))
    jsonschema.validate(json.loads("".join(out.text for out in outs)), SCHEMA)
