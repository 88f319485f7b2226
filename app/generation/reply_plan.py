"""What a chat-shaped reply will hold, decided before generation: the tool plan (and the grammar
it puts on the choices), and whether the reply starts inside a reasoning block. The same for the
three chat protocols (chat completions, Responses, Messages), from the model that will answer:
its template's tool format and reasoning (app/runtime/served.py)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import Request

from app.reasoning import prompt_opens_reasoning
from app.runtime.state import ServerState
from app.tools.choice import ToolPlan, ToolRequest, plan_and_constrain
from models import AsyncEngine, SamplingParams


async def plan_reply(
    request: Request,
    state: ServerState,
    engine: AsyncEngine,
    turn: ToolRequest,
    prompt: list[int],
    choice_params: Sequence[SamplingParams],
) -> tuple[ToolPlan | None, list[SamplingParams], bool | None]:
    """The tool plan, the choices' parameters under its grammar, and (for a reasoning model)
    whether the reply opens inside a reasoning block; a 400 for a schema that cannot be enforced."""
    served = state.served(engine)
    constraints = state.constraints(request, engine.grammars)
    special_id = engine.tokenizer.special_token_id
    plan, params = await plan_and_constrain(constraints, turn, served.tool_format, special_id, choice_params)
    reasoning = None
    if served.reasons:
        reasoning = prompt_opens_reasoning(str(engine.tokenizer.hf.decode(prompt[-8:], skip_special_tokens=False)))
    return plan, params, reasoning
