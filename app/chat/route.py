"""POST /v1/chat/completions: JSON and SSE, with tools and structured outputs."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.chat.chunks import ChatChunks
from app.chat.encoder import ChatChunkEncoder
from app.chat.render import chat_finish_reason, tool_calls_json
from app.chat.request import ChatCompletionRequest
from app.generation.collect import ChoiceResult, collect, unless_disconnected
from app.generation.light import light_route
from app.generation.pipeline import start_generation
from app.generation.rendered import generate_request
from app.generation.reply_plan import plan_reply
from app.generation.similar import similar_query
from app.generation.streaming import stream_response
from app.generation.validation import (
    check_template_variables,
    check_text_fits,
    sampling_params,
    tokenize_sized,
)
from app.openai import Usage, cached_tokens, new_chat_completion_id
from app.openai.render import chat_logprobs_json
from app.reasoning import split_reasoning
from app.runtime.body import documented_body, json_body
from app.runtime.state import generation_inputs, render_inputs
from app.tools.choice import ToolPlan
from middleware.errors import invalid_request
from models import AsyncEngine

router = APIRouter()
_parse_body = json_body(ChatCompletionRequest)


def chat_prompt(engine: AsyncEngine, body: ChatCompletionRequest, add_generation_prompt: bool = True) -> list[int]:
    """The request's prompt as the model's template renders it, checked to fit the context first."""
    check_text_fits(engine, [message.text for message in body.messages], "messages")
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    try:
        messages, kwargs = body.template_messages(), body.chat_template_kwargs
        return engine.tokenizer.encode_chat(messages, tools, kwargs, add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # a template that rejects the conversation (e.g. role order)
        message = f"The chat template could not render these messages: {exc}"
        raise invalid_request(message, param="messages") from exc


@router.post("/v1/chat/completions/render", response_model=None, openapi_extra=documented_body(ChatCompletionRequest))
async def render_chat_completion(request: Request) -> Response:
    """vLLM's render endpoint: the prompt's token ids and sampling parameters, nothing generated
    (what a router tokenizes with to route by prefix: docs/fleet.md)."""
    body, state, engine = await render_inputs(request, _parse_body)
    check_template_variables(engine, body.chat_template_kwargs)
    prompt = await tokenize_sized(len(await request.body()), lambda: chat_prompt(engine, body))
    choices = sampling_params(engine, state.settings, body, [len(prompt)], body.requested_max_tokens, "messages")
    rendered = generate_request(new_chat_completion_id(), prompt, choices, body.model, body.stream, body.priority)
    return JSONResponse(rendered)


@router.post(
    "/v1/chat/completions",
    response_model=None,
    openapi_extra=documented_body(ChatCompletionRequest),
)
async def create_chat_completion(request: Request) -> Response:
    body, state, engine = await generation_inputs(request, _parse_body)
    check_template_variables(engine, body.chat_template_kwargs)

    prompt = await tokenize_sized(len(await request.body()), lambda: chat_prompt(engine, body))
    if (light := light_route(request, state, engine, len(prompt), body.requested_max_tokens)) is not None:
        engine = light.served.engine
        update = {"model": light.served.name, "max_tokens": light.max_tokens, "max_completion_tokens": None}
        body = body.model_copy(update=update)
        prompt = await tokenize_sized(len(await request.body()), lambda: chat_prompt(engine, body))
    choice_params = sampling_params(engine, state.settings, body, [len(prompt)], body.requested_max_tokens, "messages")
    plan, choice_params, reasoning = await plan_reply(request, state, engine, body, prompt, choice_params)
    started = await start_generation(
        request,
        state,
        engine,
        [prompt],
        choice_params,
        body.priority,
        "chat",
        body.user,
        similar_query(body, "messages"),
    )
    group, choice_params, headers = started.source, started.choice_params, started.headers
    completion_id = new_chat_completion_id()
    created = int(time.time())
    if body.stream:
        encoder = ChatChunkEncoder(
            completion_id=completion_id, model=body.model, created=created, include_usage=body.include_usage
        )
        renderer = ChatChunks(encoder, engine.tokenizer, plan, reasoning)
        return stream_response(group, renderer, len(prompt), state.settings.keepalive_seconds, headers)
    results = await unless_disconnected(request, collect(group))
    want_logprobs = body.logprobs and choice_params[0].logprobs is not None  # level 1 drops them
    return JSONResponse(
        _response_body(completion_id, created, body.model, results, engine, want_logprobs, plan, reasoning),
        headers=headers,
    )


def _response_body(
    completion_id: str,
    created: int,
    model: str,
    results: list[ChoiceResult],
    engine: AsyncEngine,
    want_logprobs: bool,
    plan: ToolPlan | None,
    reasoning: bool | None,
) -> dict[str, object]:
    num_prompt = results[0].num_prompt_tokens
    num_completion = sum(len(r.token_ids) for r in results)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [_choice(i, r, engine, want_logprobs, plan, reasoning) for i, r in enumerate(results)],
        "usage": Usage.of(
            num_prompt, num_completion, cached_tokens([r.num_cached_tokens for r in results], 1)
        ).model_dump(),
    }


def _choice(
    index: int,
    result: ChoiceResult,
    engine: AsyncEngine,
    want_logprobs: bool,
    plan: ToolPlan | None,
    reasoning: bool | None,
) -> dict[str, object]:
    text = "".join(result.text)
    reasoning_content = None
    if reasoning is not None:
        reasoning_content, text = split_reasoning(text, in_reasoning=reasoning)
    # `refusal` is required by OpenAI's schema: null, surge never refuses.
    message: dict[str, object] = {"role": "assistant", "content": text, "refusal": None}
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    num_calls = 0
    if plan is not None:
        reply = plan.format.parse(text)
        message["content"] = reply.content
        if reply.calls:
            message["tool_calls"] = tool_calls_json(reply.calls)
            num_calls = len(reply.calls)
    return {
        "index": index,
        "message": message,
        "logprobs": (
            {"content": chat_logprobs_json(engine.tokenizer, result.logprobs), "refusal": None}
            if want_logprobs
            else None
        ),
        "finish_reason": chat_finish_reason(result.finish_reason, num_calls, plan),
    }
