"""POST /v1/responses: OpenAI's Responses API, JSON and SSE, with tools, text formats and reasoning.

The request becomes a chat conversation for the model's template (app/responses/turn.py) and then
takes the path every protocol shares: the checks, the tool and format grammars, the traffic
layers, the engine (app/generation/). What comes back is rendered as a Response object or its
stream of events (app/responses/output.py, app/responses/stream.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.generation.collect import ChoiceResult, ClientDisconnected, collect, unless_disconnected
from app.generation.pipeline import start_generation
from app.generation.sse import sse_response
from app.generation.streaming import stream_events
from app.generation.validation import check_model, check_text_fits, sampling_params, tokenize_sized
from app.openai.render import chat_logprobs_json
from app.reasoning import prompt_opens_reasoning, split_reasoning
from app.response_format import constrain
from app.responses.output import (
    ResponseShell,
    Usage,
    call_item,
    message_item,
    new_id,
    reasoning_item,
    status_of,
)
from app.responses.request import ResponsesRequest
from app.responses.stream import ResponseEvents
from app.responses.turn import Turn, build_turn, refusal_param
from app.runtime.body import documented_body, json_body
from app.runtime.state import generation_inputs
from app.tools.choice import ToolPlan, plan_and_constrain
from middleware.errors import OpenAIError, invalid_request, not_found
from models import AsyncEngine

router = APIRouter()
_parse_body = json_body(ResponsesRequest)


@router.post("/v1/responses", response_model=None, openapi_extra=documented_body(ResponsesRequest))
async def create_response(request: Request) -> Response:
    body, state, engine = await generation_inputs(request, _parse_body)
    check_model(state.settings, body.model)
    if body.previous_response_id is not None:
        # Nothing is stored yet: the id names no response this server knows, as OpenAI answers.
        raise not_found(
            f"Previous response with id '{body.previous_response_id}' not found.", param="previous_response_id"
        )
    turn = build_turn(body)

    def encode() -> list[int]:
        check_text_fits(engine, [str(message.get("content") or "") for message in turn.messages], "input")
        try:
            return engine.tokenizer.encode_chat(turn.messages, turn.template_tools(), None)
        except Exception as exc:  # a template that rejects the conversation (e.g. role order)
            raise invalid_request(f"The chat template could not render this input: {exc}", param="input") from exc

    try:
        prompt = await tokenize_sized(len(await request.body()), encode)
        choice_params = sampling_params(engine, state.settings, body, [len(prompt)], body.max_output_tokens, "input")
        constraints = state.constraints(request, engine.grammars)
        plan = None
        if turn.tools:
            special_id = engine.tokenizer.special_token_id
            plan, choice_params = await plan_and_constrain(
                constraints, turn, state.tool_format, special_id, choice_params
            )
        else:
            choice_params = await constrain(constraints, turn.response_format, choice_params)
    except OpenAIError as exc:
        raise refusal_param(exc) from None
    reasoning = None
    if state.reasons:
        reasoning = prompt_opens_reasoning(str(engine.tokenizer.hf.decode(prompt[-8:], skip_special_tokens=False)))
    started = await start_generation(request, state, [prompt], choice_params, body.priority, "responses")
    group, choice_params, headers = started.source, started.choice_params, started.headers
    shell = ResponseShell(body, turn)
    want_logprobs = choice_params[0].logprobs is not None  # level 1 drops them

    def count_tokens(text: str) -> int:
        return len(engine.tokenizer.encode(text))

    if body.stream:
        renderer = ResponseEvents(shell, engine.tokenizer, plan, reasoning, want_logprobs, count_tokens)
        events = stream_events(group, renderer, len(prompt), state.settings.keepalive_seconds)
        return sse_response(events, headers, on_close=lambda: group.__aexit__(None, None, None))
    try:
        (result,) = await unless_disconnected(request, collect(group))
    except ClientDisconnected:
        return Response(status_code=499)
    return JSONResponse(_response_body(shell, result, engine, plan, reasoning, want_logprobs), headers=headers)


def _response_body(
    shell: ResponseShell,
    result: ChoiceResult,
    engine: AsyncEngine,
    plan: ToolPlan | None,
    reasoning: bool | None,
    want_logprobs: bool,
) -> dict[str, object]:
    text = "".join(result.text)
    reasoning_text = None
    if reasoning is not None:
        reasoning_text, text = split_reasoning(text, in_reasoning=reasoning)
    status, incomplete = status_of(result.finish_reason)
    output = []
    if reasoning_text:
        output.append(reasoning_item(new_id("rs"), reasoning_text))
    calls = []
    if plan is not None:
        reply = plan.format.parse(text)
        text, calls = reply.content or "", reply.calls
    if text.strip() or not calls:
        logprobs = chat_logprobs_json(engine.tokenizer, result.logprobs) if want_logprobs else None
        item_status = "incomplete" if incomplete else "completed"
        output.append(message_item(new_id("msg"), text, logprobs, item_status))
    output += [_call(shell.turn, call.id, call.name, call.arguments) for call in calls]
    reasoning_tokens = len(engine.tokenizer.encode(reasoning_text)) if reasoning_text else 0
    usage = Usage(
        result.num_prompt_tokens,
        len(result.token_ids),
        result.num_cached_tokens,
        min(reasoning_tokens, len(result.token_ids)),
    )
    return shell.json(status, output, usage, incomplete=incomplete)


def _call(turn: Turn, call_id: str, name: str, arguments: str) -> dict[str, object]:
    return call_item(new_id("fc"), call_id, turn, name, arguments, "completed")
