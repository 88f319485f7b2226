"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, JSON and SSE, with
tools and thinking blocks.

The request becomes a chat conversation for the model's template (app/anthropic/turn.py), then
takes the path every protocol shares (app/generation/); errors leave in Anthropic's shape
(middleware/edge/error_shape.py), an unknown model a 404 `not_found_error`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.anthropic.output import message, new_id, stop_reason, tool_input, usage
from app.anthropic.request import CountTokensRequest, MessagesRequest
from app.anthropic.stream import MessageEvents
from app.anthropic.turn import build_turn
from app.generation.collect import collect, unless_disconnected
from app.generation.light import light_route
from app.generation.pipeline import start_generation
from app.generation.reply_plan import plan_reply
from app.generation.similar import similar_query
from app.generation.streaming import stream_response
from app.generation.turn import Turn
from app.generation.validation import check_text_fits, sampling_params, tokenize_sized
from app.reasoning import split_reasoning
from app.runtime.body import documented_body, json_body
from app.runtime.state import generation_inputs, get_engine
from middleware.errors import invalid_request
from models import AsyncEngine

router = APIRouter()
_parse_body = json_body(MessagesRequest)
_parse_count = json_body(CountTokensRequest)


def _prompt(engine: AsyncEngine, turn: Turn) -> list[int]:
    check_text_fits(engine, [str(message.get("content") or "") for message in turn.messages], "messages")
    try:
        return engine.tokenizer.encode_chat(turn.messages, turn.template_tools(), None)
    except Exception as exc:  # a template that rejects the conversation (e.g. role order)
        raise invalid_request(f"The chat template could not render these messages: {exc}", param="messages") from exc


@router.post("/v1/messages", response_model=None, openapi_extra=documented_body(MessagesRequest))
async def create_message(request: Request) -> Response:
    body, state, engine = await generation_inputs(request, _parse_body)
    turn = build_turn(body)
    prompt = await tokenize_sized(len(await request.body()), lambda: _prompt(engine, turn))
    if (light := light_route(request, state, engine, len(prompt), body.max_tokens)) is not None:
        engine, body = (
            light.served.engine,
            body.model_copy(update={"model": light.served.name, "max_tokens": light.max_tokens}),
        )
        prompt = await tokenize_sized(len(await request.body()), lambda: _prompt(engine, turn))
    choice_params = sampling_params(engine, state.settings, body, [len(prompt)], body.max_tokens, "max_tokens")
    plan, choice_params, reasoning = await plan_reply(request, state, engine, turn, prompt, choice_params)
    user = (body.metadata or {}).get("user_id")
    started = await start_generation(
        request,
        state,
        engine,
        [prompt],
        choice_params,
        body.priority,
        "messages",
        user if isinstance(user, str) else None,
        similar_query(body, "messages"),
    )
    group, headers = started.source, started.headers
    if body.stream:
        renderer = MessageEvents(body.model, len(prompt), plan, reasoning, body.stop_sequences or ())
        return stream_response(group, renderer, len(prompt), state.settings.keepalive_seconds, headers)
    (result,) = await unless_disconnected(request, collect(group))
    text = "".join(result.text)
    content: list[dict[str, object]] = []
    if reasoning is not None:
        thinking, text = split_reasoning(text, in_reasoning=reasoning)
        if thinking:
            content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    calls = []
    if plan is not None:
        reply = plan.format.parse(text)
        text, calls = reply.content or "", reply.calls
    if text.strip() or not calls:
        content.append({"type": "text", "text": text})
    for call in calls:
        block_id = "toolu" + call.id.removeprefix("call")
        content.append({"type": "tool_use", "id": block_id, "name": call.name, "input": tool_input(call.arguments)})
    totals = usage(result.num_prompt_tokens, len(result.token_ids), result.num_cached_tokens)
    reason, sequence = stop_reason(result.finish_reason, len(calls), result.stop_reason, body.stop_sequences or ())
    answer = message(new_id("msg"), body.model, content, stop_reason=reason, stop_sequence=sequence, usage=totals)
    return JSONResponse(answer, headers=headers)


@router.post("/v1/messages/count_tokens", response_model=None, openapi_extra=documented_body(CountTokensRequest))
async def count_tokens(request: Request) -> Response:
    """The prompt's tokens as `POST /v1/messages` would render it (`max_tokens` not needed)."""
    body = await _parse_count(request)
    engine = await get_engine(request, body.model)
    turn = build_turn(body)
    prompt = await tokenize_sized(len(await request.body()), lambda: _prompt(engine, turn))
    return JSONResponse({"input_tokens": len(prompt)})
