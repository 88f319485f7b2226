"""POST /v1/responses: OpenAI's Responses API, JSON and SSE, with tools, text formats and reasoning.

The request becomes a chat conversation for the model's template (app/responses/turn.py) and then
takes the path every protocol shares: the checks, the tool and format grammars, the traffic
layers, the engine (app/generation/). What comes back is rendered as a Response object or its
stream of events (app/responses/output.py, app/responses/stream.py).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse, Response

from app.generation.collect import ChoiceResult, collect, unless_disconnected
from app.generation.light import light_route
from app.generation.pipeline import start_generation
from app.generation.reply_plan import plan_reply
from app.generation.similar import similar_query
from app.generation.streaming import stream_response
from app.generation.validation import check_text_fits, sampling_params, tokenize_sized
from app.openai.render import chat_logprobs_json
from app.reasoning import split_reasoning
from app.responses.background import run_in_background
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
from app.responses.turn import Turn, build_turn, input_items, refusal_param, resolve_references
from app.runtime.body import documented_body, json_body
from app.runtime.response_store import StoredResponse
from app.runtime.response_store_redis import RUNNING
from app.runtime.state import ServerState, generation_inputs
from app.tools.choice import ToolPlan
from middleware.errors import OpenAIError, invalid_request, not_found
from middleware.generation import key_share_of
from middleware.rate_limit.concurrency import LEASE_STATE, KeyLease
from models import AsyncEngine

router = APIRouter()
_parse_body = json_body(ResponsesRequest)


@router.post("/v1/responses", response_model=None, openapi_extra=documented_body(ResponsesRequest))
async def create_response(request: Request) -> Response:
    body, state, engine = await generation_inputs(request, _parse_body)
    if body.background and not body.store:
        raise invalid_request("A background response must be stored: store=true.", param="background")
    if body.background and body.stream:
        raise invalid_request("Streaming a background response is not supported; poll it instead.", param="stream")
    tenant = tenant_of(request)
    context: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        previous = await state.responses.get(tenant, body.previous_response_id)
        if previous is None:  # never stored, expired, deleted, or another key's: all the same to this key
            message = f"Previous response with id '{body.previous_response_id}' not found."
            raise not_found(message, param="previous_response_id")
        context = previous.context
    resolve_references(body, context)
    turn = build_turn(body, context)
    own_items = input_items(body)

    async def keep(response: dict[str, Any]) -> None:
        """The finished Response, stored when the request asks (`store`, true by default); a
        background one only while it is stored as running (not once cancelled or deleted)."""
        if body.store:
            stored = StoredResponse(response, own_items, [*context, *own_items, *response["output"]])
            await state.responses.put(tenant, response["id"], stored, if_running=body.background)

    def encode() -> list[int]:
        check_text_fits(engine, [str(message.get("content") or "") for message in turn.messages], "input")
        try:
            return engine.tokenizer.encode_chat(turn.messages, turn.template_tools(), None)
        except Exception as exc:  # a template that rejects the conversation (e.g. role order)
            raise invalid_request(f"The chat template could not render this input: {exc}", param="input") from exc

    try:
        prompt = await tokenize_sized(len(await request.body()), encode)
        if (light := light_route(request, state, engine, len(prompt), body.max_output_tokens)) is not None:
            update = {"model": light.served.name, "max_output_tokens": light.max_tokens}
            engine, body = light.served.engine, body.model_copy(update=update)
            prompt = await tokenize_sized(len(await request.body()), encode)
        choice_params = sampling_params(engine, state.settings, body, [len(prompt)], body.max_output_tokens, "input")
        plan, choice_params, reasoning = await plan_reply(request, state, engine, turn, prompt, choice_params)
    except OpenAIError as exc:
        raise refusal_param(exc) from None
    user = body.safety_identifier or body.user
    started = await start_generation(
        request, state, engine, [prompt], choice_params, body.priority, "responses", user, similar_query(body, "input")
    )
    group, choice_params, headers = started.source, started.choice_params, started.headers
    shell = ResponseShell(body, turn)
    want_logprobs = choice_params[0].logprobs is not None  # level 1 drops them

    def count_tokens(text: str) -> int:
        return len(engine.tokenizer.encode(text))

    def render(result: ChoiceResult) -> dict[str, object]:
        return _response_body(shell, result, engine, plan, reasoning, want_logprobs)

    if body.background:
        queued = shell.json("queued", [], None)
        await state.responses.put(tenant, shell.id, StoredResponse(queued, own_items, context))

        def fail(error: dict[str, str]) -> dict[str, Any]:
            return shell.json("failed", [], None, error=error)

        # The key's concurrency places stay held by the run, not freed when this response ends.
        lease: KeyLease | None = request.scope.get("state", {}).get(LEASE_STATE)
        release = lease.outlive_response() if lease is not None else None
        work = run_in_background(group, state.background, state.responses, tenant, shell.id, render, fail, keep)
        state.background.start(tenant, shell.id, work, on_end=release)
        return JSONResponse(queued, headers=headers)
    if body.stream:
        renderer = ResponseEvents(shell, engine.tokenizer, plan, reasoning, want_logprobs, count_tokens)

        async def settle() -> None:
            if renderer.final is not None:
                await keep(renderer.final)

        keepalive = state.settings.keepalive_seconds
        return stream_response(group, renderer, len(prompt), keepalive, headers, settle=settle)
    (result,) = await unless_disconnected(request, collect(group))
    response = render(result)
    await keep(response)
    return JSONResponse(response, headers=headers)


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


def tenant_of(request: Request) -> str:
    """Whose stored responses a request reaches: its API key's; with auth off, everyone's one."""
    return key_share_of(request.scope) or ""


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.surge
    return state


async def _stored_or_404(request: Request, response_id: str) -> StoredResponse:
    stored = await _state(request).responses.get(tenant_of(request), response_id)
    if stored is None:
        raise not_found(f"Response with id '{response_id}' not found.")
    return stored


@router.get("/v1/responses/{response_id}", response_model=None)
async def retrieve_response(request: Request, response_id: str, stream: bool = False) -> Response:
    if stream:
        raise invalid_request("Streaming a stored response is not supported; retrieve it whole.", param="stream")
    return JSONResponse((await _stored_or_404(request, response_id)).response)


@router.delete("/v1/responses/{response_id}", response_model=None)
async def delete_response(request: Request, response_id: str) -> Response:
    state, tenant = _state(request), tenant_of(request)
    state.background.cancel(tenant, response_id)  # a run whose response is gone has nobody to answer
    if not await state.responses.delete(tenant, response_id):
        raise not_found(f"Response with id '{response_id}' not found.")
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel", response_model=None)
async def cancel_response(request: Request, response_id: str) -> Response:
    """Stop a background response: here if this replica runs it, else by a mark the replica that
    runs it finds (Redis). A finished one is answered as it is; a synchronous one cannot be."""
    state, tenant = _state(request), tenant_of(request)
    stored = await _stored_or_404(request, response_id)
    if not stored.response.get("background"):
        raise invalid_request("Cannot cancel a synchronous response.")
    if stored.response.get("status") not in RUNNING:
        return JSONResponse(stored.response)
    cancelled = StoredResponse({**stored.response, "status": "cancelled"}, stored.input_items, stored.context)
    if state.background.cancel(tenant, response_id) or not state.responses.is_shared:
        await state.responses.put(tenant, response_id, cancelled)
        return JSONResponse(cancelled.response)
    marked, finished = await state.responses.mark_cancelled(tenant, response_id, cancelled)
    if marked:
        return JSONResponse(cancelled.response)
    if finished is not None:
        return JSONResponse(finished.response)
    raise not_found(f"Response with id '{response_id}' not found.")


@router.get("/v1/responses/{response_id}/input_items", response_model=None)
async def list_input_items(
    request: Request,
    response_id: str,
    after: str | None = None,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    """The response's own input items, a page at a time, as OpenAI lists them."""
    items = list((await _stored_or_404(request, response_id)).input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise invalid_request(f"No input item with id '{after}' in this response.", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )
