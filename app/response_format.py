"""`response_format` into the grammar the engine enforces, checked before any stream opens.

`json_object` is any JSON object (OpenAI's JSON mode); `json_schema` is the given schema,
strict or not (a reply that is not enforced would be a reply the client cannot trust); `text`
is no constraint. A schema the grammar library cannot enforce (an unsupported keyword, a bad
pattern, a dangling `$ref`), or one past surge's bounds (models/grammar/json_schema.py), is a 400 naming
the problem, never an unconstrained reply. Objects that declare properties take only those
unless `--json-schema-objects open` (models/grammar/json_schema.py `close_objects` says why).

Everything from the schema walk to the compile runs on the grammar compiler's threads, never on
the event loop: a large schema takes tens of milliseconds to walk and more to compile.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request

from app.openai import ResponseFormat
from middleware.errors import OpenAIError, invalid_request
from middleware.generation import share_of
from models import GrammarCompiler, GrammarError, SamplingParams, cache_scope_of, json_schema_grammar

JSON_OBJECT: dict[str, Any] = {"type": "object"}
# The kinds of constrained requests the metrics count (surge_constrained_requests_total).
CONSTRAINED_KINDS = ("json_object", "json_schema", "tools_auto", "tools_required", "tools_named")


@dataclass(frozen=True, slots=True)
class Constraints:
    """What every grammar of one request is built and checked with."""

    compiler: GrammarCompiler
    scope: str  # whose compiled grammars it may reuse: its API key's (models/grammar/compiler.py)
    closed: bool  # objects take only their declared properties (--json-schema-objects closed)
    counts: Counter[str]  # constrained requests by kind, for the metrics

    @classmethod
    def of(cls, request: Request, compiler: GrammarCompiler, closed: bool, counts: Counter[str]) -> Constraints:
        return cls(compiler, cache_scope_of(share_of(request.scope)), closed, counts)


def grammar_of(response_format: ResponseFormat | None, closed: bool) -> str | None:
    """The grammar `response_format` asks for; None for plain text. Raises GrammarError."""
    if response_format is None or response_format.type == "text":
        return None
    schema = JSON_OBJECT
    if response_format.json_schema is not None:
        schema = response_format.json_schema.json_schema or JSON_OBJECT
    return json_schema_grammar(schema, closed=closed)


async def constrain(
    constraints: Constraints,
    response_format: ResponseFormat | None,
    choice_params: Sequence[SamplingParams],
) -> list[SamplingParams]:
    """choice_params with the grammar of `response_format`, once it is known to compile."""
    if response_format is None or response_format.type == "text":
        return list(choice_params)

    def refuse(problem: str) -> OpenAIError:
        return invalid_request(_message(response_format, problem), param="response_format")

    def build() -> str:
        grammar = grammar_of(response_format, constraints.closed)
        assert grammar is not None
        return grammar

    return await with_grammar(constraints, build, choice_params, kind=response_format.type, refuse=refuse)


async def with_grammar(
    constraints: Constraints,
    build: Callable[[], str],
    choice_params: Sequence[SamplingParams],
    *,
    kind: str,
    refuse: Callable[[str], OpenAIError],
) -> list[SamplingParams]:
    """choice_params constrained by the grammar `build` makes, once it compiles (else
    `refuse(problem)` is raised). `build` and the compile run on the compiler's threads."""
    compiler = constraints.compiler

    def prepare() -> str:
        grammar = build()
        compiler.check(grammar, constraints.scope)
        return grammar

    try:
        grammar = await asyncio.wrap_future(compiler.submit(prepare))
    except GrammarError as exc:
        raise refuse(str(exc)) from exc
    constraints.counts[kind] += 1
    return [replace(params, grammar=grammar) for params in choice_params]


def _message(response_format: ResponseFormat, problem: str) -> str:
    if response_format.json_schema is not None:
        return f"Invalid schema for response_format '{response_format.json_schema.name}': {problem}"
    return f"Invalid response_format: {problem}"
