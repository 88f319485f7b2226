"""`response_format` into the grammar the engine enforces, checked before any stream opens.

`json_object` is any JSON object (OpenAI's JSON mode); `json_schema` is the given schema,
strict or not (a reply that is not enforced would be a reply the client cannot trust); `text`
is no constraint. A schema the grammar library cannot enforce (an unsupported keyword, a bad
pattern, a dangling `$ref`) is a 400 naming the problem, never an unconstrained reply.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from app.schemas import ResponseFormat
from middleware.errors import OpenAIError, invalid_request
from models.grammar import GrammarCompiler, GrammarError, json_schema_grammar
from models.sampling_params import SamplingParams

JSON_OBJECT: dict[str, Any] = {"type": "object"}
# The kinds of constrained requests the metrics count (surge_constrained_requests_total).
CONSTRAINED_KINDS = ("json_object", "json_schema", "tools_auto", "tools_required", "tools_named")


def grammar_of(response_format: ResponseFormat | None) -> str | None:
    """The grammar `response_format` asks for; None for plain text."""
    if response_format is None or response_format.type == "text":
        return None
    schema = JSON_OBJECT
    if response_format.type == "json_schema" and response_format.json_schema is not None:
        schema = response_format.json_schema.json_schema or JSON_OBJECT
    try:
        return json_schema_grammar(schema)
    except GrammarError as exc:
        raise invalid_request(_message(response_format, str(exc)), param="response_format") from exc


async def constrain(
    compiler: GrammarCompiler,
    response_format: ResponseFormat | None,
    choice_params: Sequence[SamplingParams],
    counts: Counter[str],
) -> list[SamplingParams]:
    """choice_params with the grammar of `response_format`, once it is known to compile; the
    request is counted in `counts` by kind."""
    grammar = grammar_of(response_format)
    if grammar is None:
        return list(choice_params)
    assert response_format is not None

    def refuse(problem: str) -> OpenAIError:
        return invalid_request(_message(response_format, problem), param="response_format")

    return await with_grammar(compiler, grammar, choice_params, kind=response_format.type, counts=counts, refuse=refuse)


async def with_grammar(
    compiler: GrammarCompiler,
    grammar: str,
    choice_params: Sequence[SamplingParams],
    *,
    kind: str,
    counts: Counter[str],
    refuse: Callable[[str], OpenAIError],
) -> list[SamplingParams]:
    """choice_params constrained by `grammar` once it compiles (else `refuse(problem)` is raised)."""
    try:
        # Off the event loop: a large schema compiles for milliseconds (the library drops the GIL).
        await asyncio.to_thread(compiler.check, grammar)
    except GrammarError as exc:
        raise refuse(str(exc)) from exc
    counts[kind] += 1
    return [replace(params, grammar=grammar) for params in choice_params]


def _message(response_format: ResponseFormat, problem: str) -> str:
    if response_format.json_schema is not None:
        return f"Invalid schema for response_format '{response_format.json_schema.name}': {problem}"
    return f"Invalid response_format: {problem}"
