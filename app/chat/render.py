"""A chat choice's tool calls and finish reason in Chat Completions' words."""

from __future__ import annotations

from collections.abc import Sequence

from app.openai.render import finish_reason_text
from app.tools.calls import ToolCall
from app.tools.choice import ToolPlan
from models import FinishReason


def chat_finish_reason(reason: FinishReason | None, num_calls: int, plan: ToolPlan | None) -> str | None:
    """A chat choice's finish: `tool_calls` when it stopped having called tools, except for a
    named tool_choice, which OpenAI finishes with `stop`; a cut (`length`) stays a cut."""
    text = finish_reason_text(reason)
    if text == "stop" and num_calls and plan is not None and not plan.named:
        return "tool_calls"
    return text


def tool_calls_json(calls: Sequence[ToolCall]) -> list[dict[str, object]]:
    return [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        for call in calls
    ]
