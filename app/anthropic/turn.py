"""A Messages API request as the shared generation path takes it (app/generation/turn.py).

`system` is the first system turn. A user message's `text` blocks are its content and each
`tool_result` block a tool turn (before the text, as Anthropic places them first); an assistant
message's `text` blocks are its content and its `tool_use` blocks its tool calls. `thinking`
blocks sent back are dropped, as chat templates drop earlier turns' thinking. Image and document
blocks are a 400: the served models read text.

Client tools (`input_schema`) are chat's function tools; server tools (a versioned `type` such as
`web_search_20250305`) are accepted and not offered: surge cannot run them. `tool_choice`: `auto`,
`any` (a call is required), `tool` (that one), `none`; `disable_parallel_tool_use` allows one call.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from app.anthropic.request import MessagesRequest, ToolChoiceParam
from app.generation.turn import Turn
from app.openai.tools import FunctionDefinition, NamedFunction, NamedToolChoice, ToolDefinition
from middleware.errors import invalid_request

_TEXT_ONLY = "This model reads text only: '{kind}' blocks are not supported."


def build_turn(body: MessagesRequest) -> Turn:
    tools = _tools(body)
    choice = body.tool_choice
    return Turn(
        messages=_messages(body),
        tools=tools or None,
        effective_tool_choice=_tool_choice(choice, tools),
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
        response_format=None,
    )


def _messages(body: MessagesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = _text(body.system, "system") if body.system is not None else ""
    if system:
        messages.append({"role": "system", "content": system})
    for index, message in enumerate(body.messages):
        where = f"messages.{index}.content"
        if isinstance(message.content, str):
            messages.append({"role": message.role, "content": message.content})
            continue
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block_index, block in enumerate(message.content):
            kind = block.get("type")
            param = f"{where}.{block_index}"
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_result" and message.role == "user":
                content = _text(block.get("content", ""), param)
                if block.get("is_error"):
                    content = f"Error: {content}"
                messages.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": content})
            elif kind == "tool_use" and message.role == "assistant":
                arguments = block.get("input") if isinstance(block.get("input"), dict) else {}
                call = {"name": str(block.get("name", "")), "arguments": arguments}
                calls.append({"id": str(block.get("id", "")), "type": "function", "function": call})
            elif kind in ("thinking", "redacted_thinking") and message.role == "assistant":
                continue
            elif kind in ("image", "document", "search_result"):
                raise invalid_request(_TEXT_ONLY.format(kind=kind), param=param)
            else:
                raise invalid_request(f"A '{kind}' block is not supported in a {message.role} message.", param=param)
        has_results = any(block.get("type") == "tool_result" for block in message.content)
        if texts or not (calls or has_results):  # a turn of only thinking still takes its place
            messages.append({"role": message.role, "content": "\n".join(texts)})
        if calls:
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]:
                messages[-1]["tool_calls"] = calls
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": calls})
    return messages


def _text(content: Any, param: str) -> str:
    """A string, or the text of a list of blocks (system prompts and tool results take both)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                raise invalid_request(_TEXT_ONLY.format(kind=kind), param=param)
            texts.append(block["text"])
        return "\n".join(texts)
    return json.dumps(content)


def _tools(body: MessagesRequest) -> list[ToolDefinition]:
    tools = []
    for index, tool in enumerate(body.tools or []):
        if tool.type not in (None, "custom") or tool.input_schema is None:
            continue  # a server tool (web search, code execution, ...): surge cannot run it
        spec = {"name": tool.name, "description": tool.description, "parameters": tool.input_schema}
        try:
            tools.append(ToolDefinition(type="function", function=FunctionDefinition.model_validate(spec)))
        except ValidationError as exc:
            raise invalid_request(f"Invalid tool: {exc.errors()[0]['msg']}", param=f"tools.{index}") from exc
    names = [tool.function.name for tool in tools]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise invalid_request(f"Tool names must be unique; {', '.join(duplicated)} appears more than once.")
    return tools


def _tool_choice(choice: ToolChoiceParam | None, tools: list[ToolDefinition]) -> str | NamedToolChoice:
    if not tools or (choice is not None and choice.type == "none"):
        if choice is not None and choice.type in ("any", "tool"):
            raise invalid_request(f"tool_choice '{choice.type}' needs a client tool.", param="tool_choice")
        return "none"
    if choice is None or choice.type == "auto":
        return "auto"
    if choice.type == "any":
        return "required"
    if choice.name not in {tool.function.name for tool in tools}:
        raise invalid_request(f"tool_choice names '{choice.name}', which is not one of the tools.", param="tool_choice")
    return NamedToolChoice(type="function", function=NamedFunction(name=str(choice.name)))
