"""The Response object and its output items, as OpenAI's published schema has them.

Ids: `resp_`, `msg_`, `fc_`, `rs_` and 48 hex digits; a function call's `call_id` is the tool-call
parser's (`call_...`). `status` is `completed`, or `incomplete` with `incomplete_details.reason`
`max_output_tokens` when the reply was cut; a failure after the stream opened is `failed` with an
`error`. Every request parameter the object has a place for is echoed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from app.responses.request import ResponsesRequest
from app.responses.turn import Turn, new_id
from models import FinishReason

# OpenAI's ResponseErrorCode values for what can go wrong after a stream opened.
ERROR_CODES = {"invalid_request_error": "invalid_prompt", "server_error": "server_error"}


@dataclass(slots=True)
class Usage:
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def json(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            # Prefix-cache blocks are kept as a side effect of serving, not written on request.
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass(slots=True)
class ResponseShell:
    """What a Response says about its request, fixed when it is created."""

    body: ResponsesRequest
    turn: Turn
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def json(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: Usage | None,
        *,
        incomplete: str | None = None,
        error: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body = self.body
        text_format: dict[str, Any] = {"type": "text"}
        if body.text is not None and body.text.format is not None:
            text_format = body.text.format.model_dump(exclude_none=True, by_alias=True)
        reasoning = body.reasoning.model_dump(exclude_none=True) if body.reasoning else {}
        response: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": body.max_tool_calls,
            "model": body.model,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "service_tier": "default",
            "store": body.store,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": text_format},
            "tool_choice": body.tool_choice if body.tool_choice is not None else ("auto" if body.tools else "none"),
            "tools": [_echo_tool(tool) for tool in body.tools or []],
            "top_logprobs": body.top_logprobs or 0,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": body.truncation or "disabled",
            "metadata": body.metadata or {},
            "prompt_cache_key": body.prompt_cache_key,
            "safety_identifier": body.safety_identifier,
            "background": body.background,
        }
        # Optional fields the schema does not let be null: left out until they have a value.
        if usage is not None:
            response["usage"] = usage.json()
        if body.user is not None:
            response["user"] = body.user
        return response


def _echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the Response lists it: a function's `strict` stated (true unless the request said
    otherwise, as OpenAI's default is), its `parameters` present; a namespace's functions alike."""
    if tool.get("type") == "function":
        strict = tool.get("strict")
        return {**tool, "parameters": tool.get("parameters"), "strict": True if strict is None else strict}
    if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
        return {**tool, "tools": [_echo_tool(inner) if isinstance(inner, dict) else inner for inner in tool["tools"]]}
    return tool


def status_of(reason: FinishReason | None) -> tuple[str, str | None]:
    """(status, incomplete reason) of a finished reply."""
    if reason is FinishReason.LENGTH:
        return "incomplete", "max_output_tokens"
    return "completed", None


def message_item(item_id: str, text: str, logprobs: list[dict[str, Any]] | None, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [text_part(text, logprobs)] if status != "in_progress" else [],
    }


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def reasoning_item(item_id: str, text: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
    if text is not None:
        item["content"] = [{"type": "reasoning_text", "text": text}]
    return item


def call_item(item_id: str, call_id: str, turn: Turn, offered_name: str, arguments: str, status: str) -> dict[str, Any]:
    namespace, name = turn.call_name(offered_name)
    item: dict[str, Any] = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item
