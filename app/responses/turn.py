"""A Responses request as the shared generation path needs it: chat messages for the template,
function tools, the tool choice and the response format.

Input items become chat turns: messages (`input_text`/`output_text` parts joined), `function_call`
items an assistant turn's tool calls (consecutive calls join one turn, as parallel calls),
`function_call_output` items tool turns. `reasoning` items sent back are dropped, as chat
templates drop earlier turns' thinking. `instructions` is the first system turn.

Tools: `function` tools as chat's; a `namespace` group's functions are offered as
`namespace__function` (a name the model can write) and the call comes back with its
`namespace` and the function's own name. Other tool types (`custom`, `web_search`,
`image_generation`, `local_shell`, ...) are accepted and not offered: surge cannot run them.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from pydantic import ValidationError

from app.generation.turn import Turn
from app.openai import JsonSchemaFormat, ResponseFormat
from app.openai.tools import FunctionDefinition, NamedFunction, NamedToolChoice, ToolDefinition
from app.responses.request import ResponsesRequest, TextFormat
from middleware.errors import OpenAIError, invalid_request

NAMESPACE_SEPARATOR = "__"
# Parts that carry text into the prompt, and what each keeps.
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_ROLES = {"user", "system", "developer", "assistant"}


def build_turn(body: ResponsesRequest, context: list[dict[str, Any]] | None = None) -> Turn:
    """`context`: the items a `previous_response_id` chain holds, before this request's input."""
    tools, namespaces = _tools(body.tools or [])
    return Turn(
        messages=_messages(body, context or []),
        tools=tools or None,
        effective_tool_choice=_tool_choice(body.tool_choice, tools, namespaces),
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=_response_format(body.text.format if body.text else None),
        namespaces=namespaces,
    )


def _messages(body: ResponsesRequest, context: list[dict[str, Any]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    items = [*context, *([{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input)]
    for position, item in enumerate(items):
        index = position - len(context)  # the client's own index; the chain's items are ours, valid
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, index))
        elif kind in ("function_call", "custom_tool_call"):
            _add_call(messages, item, index)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(
                {"role": "tool", "tool_call_id": _text_field(item, "call_id", index), "content": _output(item)}
            )
        elif kind == "reasoning":
            continue
        else:
            raise invalid_request(f"Input items of type '{kind}' are not supported.", param=f"input[{index}].type")
    return messages


def _message(item: dict[str, Any], index: int) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise invalid_request(
            f"Invalid role {role!r}: one of 'user', 'system', 'developer', 'assistant'.", param=f"input[{index}].role"
        )
    content = item.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for part_index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            key = _TEXT_PARTS.get(str(kind))
            if key is None or not isinstance(part.get(key), str):
                param = f"input[{index}].content[{part_index}]"
                if kind in ("input_image", "input_file", "input_audio"):
                    raise invalid_request(f"This model reads text only: '{kind}' parts are not supported.", param=param)
                raise invalid_request(f"Content parts of type {kind!r} are not supported.", param=param)
            texts.append(part[key])
        text = "\n".join(texts)
    else:
        raise invalid_request(
            "A message's content must be a string or a list of parts.", param=f"input[{index}].content"
        )
    return {"role": "system" if role == "developer" else role, "content": text}


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any], index: int) -> None:
    """An earlier call, as chat templates expect it: on the assistant turn before it, or a new one."""
    name = _text_field(item, "name", index)
    namespace = item.get("namespace")
    if isinstance(namespace, str) and namespace:
        name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    raw = item.get("arguments", item.get("input", "{}"))
    arguments: Any = raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        arguments = parsed if isinstance(parsed, dict) else raw
    call = {
        "id": _text_field(item, "call_id", index),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_call_id" not in last:
        last.setdefault("tool_calls", []).append(call)
        if not last.get("content"):
            last["content"] = None
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _output(item: dict[str, Any]) -> str:
    output = item.get("output", "")
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "\n".join(str(part.get("text", "")) for part in output if isinstance(part, dict))
    return json.dumps(output)


def _text_field(item: dict[str, Any], name: str, index: int) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise invalid_request(
            f"'{name}' is required for an input item of type '{item.get('type')}'.", param=f"input[{index}].{name}"
        )
    return value


def _tools(entries: list[dict[str, Any]]) -> tuple[list[ToolDefinition], dict[str, tuple[str, str]]]:
    tools: list[ToolDefinition] = []
    namespaces: dict[str, tuple[str, str]] = {}
    for index, entry in enumerate(entries):
        kind = entry.get("type")
        if kind == "function":
            tools.append(_function(entry, f"tools[{index}]"))
        elif kind == "namespace":
            group, members = entry.get("name"), entry.get("tools")
            if not isinstance(group, str) or not group or not isinstance(members, list):
                raise invalid_request("A namespace tool needs a 'name' and a list of 'tools'.", param=f"tools[{index}]")
            for inner_index, inner in enumerate(members):
                if not isinstance(inner, dict) or inner.get("type") != "function":
                    continue  # a custom tool in a group: not offered, as outside one
                tool = _function(inner, f"tools[{index}].tools[{inner_index}]", prefix=f"{group}{NAMESPACE_SEPARATOR}")
                namespaces[tool.function.name] = (group, str(inner.get("name")))
                tools.append(tool)
        # Every other type (custom, web_search, image_generation, local_shell, mcp, ...) is a tool
        # surge cannot run: accepted and not offered to the model.
    names = [tool.function.name for tool in tools]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise invalid_request(
            f"Tool names must be unique; {', '.join(duplicated)} appears more than once.", param="tools"
        )
    return tools, namespaces


def _function(entry: dict[str, Any], param: str, prefix: str = "") -> ToolDefinition:
    spec = {key: entry.get(key) for key in ("name", "description", "parameters", "strict")}
    spec["name"] = prefix + str(spec["name"] or "")
    try:
        return ToolDefinition(type="function", function=FunctionDefinition.model_validate(spec))
    except ValidationError as exc:
        raise invalid_request(f"Invalid function tool: {exc.errors()[0]['msg']}", param=param) from exc


def _tool_choice(
    choice: str | dict[str, Any] | None, tools: list[ToolDefinition], namespaces: dict[str, tuple[str, str]]
) -> str | NamedToolChoice:
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise invalid_request(
                f"Invalid tool_choice {choice!r}: 'auto', 'none', 'required' or a tool.", param="tool_choice"
            )
        if choice == "required" and not tools:
            raise invalid_request(
                "tool_choice 'required' needs a function tool this server can offer.", param="tool_choice"
            )
        return choice if tools else "none"
    kind = choice.get("type")
    if kind == "function":
        name = str(choice.get("name") or "")
        offered = {tool.function.name for tool in tools}
        if name not in offered:  # a namespaced function may be named by its own name
            name = next((key for key, (_, own) in namespaces.items() if own == name), name)
        if name not in offered:
            raise invalid_request(
                f"tool_choice names '{name}', which is not one of the request's function tools.", param="tool_choice"
            )
        return NamedToolChoice(type="function", function=NamedFunction(name=name))
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        return ("required" if mode == "required" else "auto") if tools else "none"
    raise invalid_request(f"tool_choice of type {kind!r} names a tool this server cannot run.", param="tool_choice")


def _response_format(text_format: TextFormat | None) -> ResponseFormat | None:
    if text_format is None or text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return ResponseFormat(type="json_object")
    if text_format.name is None:
        raise invalid_request("text.format of type 'json_schema' needs a 'name'.", param="text.format.name")
    schema = JsonSchemaFormat.model_validate(
        {
            "name": text_format.name,
            "description": text_format.description,
            "schema": text_format.json_schema,
            "strict": text_format.strict,
        }
    )
    return ResponseFormat(type="json_schema", json_schema=schema)


def refusal_param(error: OpenAIError) -> OpenAIError:
    """Chat's parameter names in a refusal of the shared path, in the Responses API's words."""
    renamed = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens"}
    if error.param in renamed:
        error.param = renamed[error.param]
    return error


def resolve_references(body: ResponsesRequest, context: list[dict[str, Any]]) -> None:
    """`item_reference` inputs replaced by the items they name, from the `previous_response_id`
    chain (every item it holds has its id); one that names no item there is a 400."""
    if isinstance(body.input, str) or not any(item.get("type") == "item_reference" for item in body.input):
        return
    by_id = {item["id"]: item for item in context if isinstance(item.get("id"), str)}
    resolved = []
    for index, item in enumerate(body.input):
        if item.get("type") == "item_reference":
            found = by_id.get(item.get("id"))
            if found is None:
                raise invalid_request(
                    f"Item with id {item.get('id')!r} not found: a reference names an item of the "
                    "previous_response_id chain.",
                    param=f"input[{index}].id",
                )
            item = found
        resolved.append(item)
    body.input = resolved


def input_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as stored items, each with an id: what `input_items` lists and a
    continuation starts from."""
    raw = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    items = []
    for item in raw:
        kind = item.get("type", "message")
        if kind == "message":
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            content = item.get("content")
            parts = [{"type": part, "text": content}] if isinstance(content, str) else content
            item = {"type": "message", "status": "completed", **item, "content": parts}
            prefix = "msg"
        else:
            prefix = {"function_call": "fc", "reasoning": "rs"}.get(str(kind), "item")
        items.append({"id": new_id(prefix), **item})  # a referenced item keeps its own id
    return items


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"
