"""OpenAI's tool fields: `tools`, `tool_choice`, and the tool calls of assistant messages.

Only `function` tools exist in Chat Completions. A function's name follows OpenAI's rule
(`^[a-zA-Z0-9_-]{1,64}$`); its `parameters` is a JSON Schema object, checked against the grammar
library when the request is built (app/tools/choice.py), where an unsupported keyword is a 400.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from app.openai.base import RequestModel

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class FunctionDefinition(RequestModel):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(RequestModel):
    name: str
    arguments: str  # JSON text, as the model wrote it


class MessageToolCall(RequestModel):
    """A call in the history: an earlier assistant turn's `tool_calls` entry."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction

    def template_dict(self) -> dict[str, Any]:
        """For chat templates, most of which `tojson` the arguments: an object when the text is one."""
        arguments: Any = self.function.arguments
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            arguments = parsed
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": arguments}}
