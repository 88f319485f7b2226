"""Grammars that make a model call tools in its own format (llguidance's Lark syntax).

- `required`: one call or more (one when `parallel_tool_calls` is false), each a valid call of
  one of the tools: the format's tags around `{"name": ..., "arguments": ...}` whose arguments
  match that tool's `parameters` schema.
- a named tool: one call of that tool.
- `auto`: free text until the model opens a call (the format's opening tag, or for Llama 3 a
  reply that starts with `{`), then the call is held to the same grammar as above: a lazy
  grammar, triggered by the tag, as llama.cpp's are. Free text can never contain the tag, so a
  call cannot escape the grammar by looking like text. With a `response_format`, the content
  alternative is the document instead of free text.

Tags that are special tokens of the tokenizer (Mistral's `[TOOL_CALLS]`) are written as
tokens (`<[id]>`): a model emits the token, never the characters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from models import JSON_OPTIONS

# A function that takes no parameters takes an empty object (OpenAI: "omitting `parameters`
# defines a function with an empty parameter list").
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
ANY = "/(?s:.*)/"

# A tag as a Lark terminal: a quoted string, or a special token (GrammarCompiler.terminal).
TagTerminal = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    name: str
    parameters: Mapping[str, Any] | None


def literal(tag: str) -> str:
    return json.dumps(tag)


def call_schema(functions: Sequence[FunctionSpec], arguments_key: str) -> dict[str, Any]:
    """The JSON Schema of one call object of any of `functions`, name first."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": function.name},
                arguments_key: dict(function.parameters) if function.parameters is not None else NO_PARAMETERS,
            },
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for function in functions
    ]
    schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    return {**schema, "x-guidance": dict(JSON_OPTIONS)}


def _json_rule(name: str, schema: Mapping[str, Any]) -> str:
    return f"{name}: %json {json.dumps(schema)}\n"


def _regex_literal(text: str) -> str:
    special = set("\\.^$|?*+()[]{}/")
    return "".join("\\" + char if char in special else char for char in text)


@dataclass(frozen=True, slots=True)
class CallGrammar:
    """What a request asks of the grammar of its reply."""

    functions: Sequence[FunctionSpec]  # for "named", only the named one
    choice: str  # "auto", "required" or "named"
    parallel: bool
    content: Mapping[str, Any] | None = None  # auto's alternative to calls: this document, not free text
    terminal: TagTerminal = literal

    @property
    def many(self) -> bool:
        return self.parallel and self.choice != "named"


def hermes_grammar(request: CallGrammar) -> str:
    open_, close = request.terminal("<tool_call>"), request.terminal("</tool_call>")
    more = ' ("\\n" call)*' if request.many else ""
    body = _json_rule("body", call_schema(request.functions, "arguments"))
    rules = f'call: {open_} "\\n" body "\\n" {close}\n' + body
    auto = _auto("<tool_call>", open_, f'"\\n" body "\\n" {close}{more}')
    return _assemble(request, f"call{more}", auto, rules)


def llama3_grammar(request: CallGrammar) -> str:
    more = ' ("; " body)*' if request.many else ""
    rules = _json_rule("body", call_schema(request.functions, "parameters"))
    # A reply that is no call must not start with a brace (after whitespace): that starts a call.
    auto = f"start: FREE | body{more}\nFREE: {ANY} & ~/\\s*\\{{(?s:.*)/\n"
    return _assemble(request, f"body{more}", auto, rules)


def mistral_grammar(request: CallGrammar) -> str:
    """The v3 form (`[TOOL_CALLS] [call, ...]`)."""
    open_ = request.terminal("[TOOL_CALLS]")
    more = ' (", " body)*' if request.many else ""
    rules = _json_rule("body", call_schema(request.functions, "arguments"))
    calls = f'" [" body{more} "]"'
    return _assemble(request, f"{open_} {calls}", _auto("[TOOL_CALLS]", open_, calls), rules)


def _assemble(request: CallGrammar, calls: str, auto: str, rules: str) -> str:
    """The grammar for the request's choice: the calls alone, or (auto) the calls or the
    content document, or the format's free text and lazy calls."""
    if request.choice != "auto":
        return f"start: {calls}\n" + rules
    if request.content is not None:
        return f"start: content | {calls}\n" + rules + _json_rule("content", request.content)
    return auto + rules


def _auto(tag: str, open_terminal: str, after_open: str) -> str:
    """Free text, or free text up to the opening tag and then the calls (`after_open`).

    Free text can never contain the tag's characters. When the tag is a special token it is
    never text either, so FREE simply ends where the token comes. When it is text, a lazy head
    ends at its first occurrence, so the text up to it is free and what follows is not.
    """
    free = f"FREE: {ANY} & ~/(?s:.*){_regex_literal(tag)}(?s:.*)/\n"
    if open_terminal.startswith("<["):
        return f"start: FREE | FREE {open_terminal} {after_open}\n" + free
    return f"start: FREE | head {after_open}\nhead[lazy]: TEXT {open_terminal}\nTEXT: {ANY}\n" + free
