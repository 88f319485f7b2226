"""`tools`, `tool_choice` and `parallel_tool_calls` into a grammar and a parser for the reply.

- `none` (the default without tools): the tools are still shown to the template, the reply is
  plain content and never has calls (a `response_format` still applies).
- `auto` (the default with tools): free text, or calls once the model opens one, each held to
  its tool's schema; with a `response_format`, the text alternative is that document.
- `required`: one call or more; a named tool: exactly one call of it (finish reason `stop`, as
  OpenAI gives for a named choice, against `tool_calls` otherwise).
- `parallel_tool_calls: false`: at most one call.

A tool whose `parameters` the grammar library cannot enforce is a 400 naming `tools`, before
any stream opens, like a bad `response_format`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from app.openai import ResponseFormat
from app.openai.tools import FunctionDefinition, NamedToolChoice, ToolDefinition
from app.response_format import JSON_OBJECT, Constraints, constrain, with_grammar
from app.tools.formats import ToolFormat
from app.tools.grammar import CallGrammar, FunctionSpec, hermes_grammar, llama3_grammar, mistral_grammar
from middleware.errors import OpenAIError, invalid_request
from models import (
    JSON_OPTIONS,
    GrammarCompiler,
    GrammarError,
    SamplingParams,
    SchemaTooComplex,
    check_bounds,
    checked_schema,
    json_schema_grammar,
)

GrammarBuilder = Callable[[CallGrammar], str]
GRAMMARS: dict[str, GrammarBuilder] = {
    "hermes": hermes_grammar,
    "llama3_json": llama3_grammar,
    "mistral": mistral_grammar,
}


class ToolRequest(Protocol):
    """What a protocol's request gives tool planning (Chat Completions' body is one)."""

    @property
    def tools(self) -> list[ToolDefinition] | None: ...

    @property
    def effective_tool_choice(self) -> str | NamedToolChoice: ...

    @property
    def parallel_tool_calls(self) -> bool: ...

    @property
    def response_format(self) -> ResponseFormat | None: ...


@dataclass(frozen=True, slots=True)
class ToolPlan:
    format: ToolFormat  # parses the reply into content and calls
    grammar: str  # llguidance grammar text
    kind: str  # tools_auto, tools_required, tools_named: the metrics' kind
    named: bool  # a named tool_choice: the finish reason stays "stop"
    keep_special_ids: tuple[int, ...]  # the format's tags that are special tokens, kept in the text


def plan_tools(
    request: ToolRequest,
    fmt: ToolFormat,
    terminal: Callable[[str], str],
    special_id: Callable[[str], int | None],
    closed: bool = True,
) -> ToolPlan | None:
    """The request's tool plan; None when no call may be made (no tools, or `none`).
    `terminal` writes a tag into a grammar; `special_id` says which tags are special tokens;
    `closed`: argument objects take only their declared properties. Raises an OpenAIError (400)
    naming the tool whose parameters are past surge's bounds (models/grammar/json_schema.py). Walks
    every schema: run it off the event loop."""
    choice = request.effective_tool_choice
    if not request.tools or choice == "none":
        return None
    functions = [FunctionSpec(tool.function.name, _parameters(tool.function, closed)) for tool in request.tools]
    try:  # together, too: they make one grammar
        check_bounds({"$defs": {str(i): function.parameters or {} for i, function in enumerate(functions)}})
    except SchemaTooComplex as exc:
        raise invalid_request(f"Invalid tools: taken together, {exc}", param="tools") from exc
    mode: str
    if isinstance(choice, NamedToolChoice):
        functions = [function for function in functions if function.name == choice.function.name]
        mode = "named"
    else:
        mode = choice
    content = _content_schema(request.response_format, closed) if mode == "auto" else None
    grammar = GRAMMARS[fmt.name](CallGrammar(functions, mode, request.parallel_tool_calls, content, terminal))
    keep = tuple(token_id for token_id in map(special_id, fmt.tags) if token_id is not None)
    return ToolPlan(fmt, grammar, f"tools_{mode}", mode == "named", keep)


def _parameters(function: FunctionDefinition, closed: bool) -> Mapping[str, Any] | None:
    if function.parameters is None:
        return None
    try:
        return checked_schema(function.parameters, closed=closed)
    except GrammarError as exc:
        raise invalid_request(f"Invalid schema for function '{function.name}': {exc}", param="tools") from exc


def _content_schema(response_format: ResponseFormat | None, closed: bool) -> Mapping[str, Any] | None:
    if response_format is None or response_format.type == "text":
        return None
    schema: Mapping[str, Any] = JSON_OBJECT
    if response_format.json_schema is not None and response_format.json_schema.json_schema:
        schema = response_format.json_schema.json_schema
    try:
        schema = checked_schema(schema, closed=closed)
    except GrammarError as exc:
        raise invalid_request(f"Invalid schema for response_format: {exc}", param="response_format") from exc
    return {**schema, "x-guidance": dict(JSON_OPTIONS)}


async def plan_and_constrain(
    constraints: Constraints,
    request: ToolRequest,
    fmt: ToolFormat,
    special_id: Callable[[str], int | None],
    choice_params: Sequence[SamplingParams],
) -> tuple[ToolPlan | None, list[SamplingParams]]:
    """The request's tool plan and choice_params under its grammar (or under `response_format`'s
    when no call may be made); a 400 naming the tool whose schema cannot be enforced."""
    if not request.tools:  # nothing to plan: no hop to the compiler's threads
        return None, await constrain(constraints, request.response_format, choice_params)
    compiler = constraints.compiler
    plan_work = compiler.submit(plan_tools, request, fmt, compiler.terminal, special_id, constraints.closed)
    plan = await asyncio.wrap_future(plan_work)
    if plan is None:
        return None, await constrain(constraints, request.response_format, choice_params)

    def refuse(problem: str) -> OpenAIError:
        return invalid_request(culprit or f"Invalid tools: {problem}", param="tools")

    culprit: str | None = None

    def build() -> str:
        nonlocal culprit
        try:
            compiler.check(plan.grammar, constraints.scope)
        except GrammarError:
            culprit = _culprit(compiler, request, constraints)  # on this thread, not the event loop
            raise
        return plan.grammar

    constrained = await with_grammar(constraints, build, choice_params, kind=plan.kind, refuse=refuse)
    if plan.keep_special_ids:
        constrained = [replace(params, keep_special_ids=plan.keep_special_ids) for params in constrained]
    return plan, constrained


def _culprit(compiler: GrammarCompiler, request: ToolRequest, constraints: Constraints) -> str | None:
    """The first tool whose parameters alone fail to compile, as an error message (the error
    path only: each schema is compiled on its own to name the one at fault)."""
    for tool in request.tools or []:
        if tool.function.parameters is None:
            continue
        try:
            grammar = json_schema_grammar(tool.function.parameters, closed=constraints.closed)
            compiler.check(grammar, constraints.scope)
        except GrammarError as exc:
            return f"Invalid schema for function '{tool.function.name}': {exc}"
    return None
