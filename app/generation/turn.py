"""A conversation as the shared generation path takes it, whatever protocol it came in: messages
for the model's chat template, function tools, the tool choice and the response format.

Chat Completions' body is one already; the Responses and Messages APIs build one from their own
items and blocks (app/responses/turn.py, app/anthropic/turn.py). It is what app/tools/choice.py's
`ToolRequest` asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.openai import ResponseFormat
from app.openai.tools import NamedToolChoice, ToolDefinition


@dataclass(slots=True)
class Turn:
    """What app/tools/choice.py's `ToolRequest` asks, and the template's messages and tools."""

    messages: list[dict[str, Any]]
    tools: list[ToolDefinition] | None
    effective_tool_choice: str | NamedToolChoice
    parallel_tool_calls: bool
    response_format: ResponseFormat | None
    # An offered name -> (namespace, the function's own name), for calls from a namespace group.
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [tool.model_dump(exclude_none=True) for tool in self.tools] if self.tools else None

    def call_name(self, offered: str) -> tuple[str | None, str]:
        """(namespace, name) of a call the model made by its offered name."""
        return self.namespaces.get(offered, (None, offered))
