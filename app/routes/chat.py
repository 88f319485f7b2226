"""POST /v1/chat/completions: JSON and SSE."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.body import documented_body, json_body
from app.generation import (
    ChoiceResult,
    ClientDisconnected,
    chat_logprobs_json,
    check_model,
    check_text_fits,
    collect,
    finish_reason_text,
    sampling_params,
    unless_disconnected,
)
from app.pipeline import start_generation
from app.schemas import ChatChunkEncoder, ChatCompletionRequest, Usage, new_chat_completion_id
from app.sse import DONE, KEEPALIVE, LastEvents, error_event, event, sse_response
from app.state import generation_inputs
from middleware.errors import invalid_request
from models.async_engine import AsyncEngine
from models.outputs import OutputSource

router = APIRouter()
_parse_body = json_body(ChatCompletionRequest)


@router.post(
    "/v1/chat/completions",
    response_model=None,
    openapi_extra=documented_body(ChatCompletionRequest),
)
async def create_chat_completion(request: Request) -> Response:
    body, state, engine = await generation_inputs(request, _parse_body)
    check_model(state.settings, body.model)
    check_text_fits(engine, [message.text for message in body.messages], "messages")
    try:
        prompt = engine.tokenizer.encode_chat(body.template_messages())
    except Exception as exc:  # a template that rejects the conversation (e.g. role order)
        raise invalid_request(f"The chat template could not render these messages: {exc}", param="messages") from exc
    choice_params = sampling_params(engine, body, len(prompt), body.requested_max_tokens, "messages")
    started = await start_generation(request, state, [prompt], choice_params, body.priority, "chat")
    group, choice_params, headers = started.source, started.choice_params, started.headers
    completion_id = new_chat_completion_id()
    created = int(time.time())
    if body.stream:
        encoder = ChatChunkEncoder(
            completion_id=completion_id, model=body.model, created=created, include_usage=body.include_usage
        )
        return sse_response(
            _stream(group, encoder, engine, len(prompt), state.settings.keepalive_seconds, body.include_usage),
            headers,
            on_close=lambda: group.__aexit__(None, None, None),
        )
    try:
        results = await unless_disconnected(request, collect(group))
    except ClientDisconnected:
        return Response(status_code=499)
    want_logprobs = body.logprobs and choice_params[0].logprobs is not None  # level 1 drops them
    return JSONResponse(
        _response_body(completion_id, created, body.model, results, engine, want_logprobs), headers=headers
    )


def _response_body(
    completion_id: str,
    created: int,
    model: str,
    results: list[ChoiceResult],
    engine: AsyncEngine,
    want_logprobs: bool,
) -> dict[str, object]:
    num_prompt = results[0].num_prompt_tokens
    num_completion = sum(len(r.token_ids) for r in results)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": "".join(r.text)},
                "logprobs": {"content": chat_logprobs_json(engine.tokenizer, r.logprobs)} if want_logprobs else None,
                "finish_reason": finish_reason_text(r.finish_reason),
            }
            for i, r in enumerate(results)
        ],
        "usage": Usage.of(num_prompt, num_completion).model_dump(),
    }


async def _stream(
    group: OutputSource,
    encoder: ChatChunkEncoder,
    engine: AsyncEngine,
    num_prompt: int,
    keepalive: float,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    num_completion = 0
    # The role chunk goes out with the first tokens (as vLLM's does), the last tokens with the
    # usage and [DONE]: fewer writes per stream (app/sse.py, LastEvents).
    role = b"".join(event(encoder.role(i)) for i in range(len(group.request_ids)))
    last = b""
    async with group:
        while not group.finished:
            outputs = await group.next_outputs(keepalive)
            if not outputs:
                yield KEEPALIVE
                continue
            parts: list[bytes] = [role]
            role = b""
            for out in outputs:
                if out.error is not None:
                    yield LastEvents(b"".join(parts) + error_event(out.error) + DONE)
                    return
                index = group.index[out.request_id]
                num_completion += len(out.token_ids)
                logprobs = chat_logprobs_json(engine.tokenizer, out.logprobs) if out.logprobs else None
                if out.text or logprobs:
                    parts.append(event(encoder.delta(index, out.text, logprobs=logprobs)))
                if out.finished:
                    parts.append(event(encoder.delta(index, None, finish_reason=finish_reason_text(out.finish_reason))))
            if group.finished:
                last = b"".join(parts)
            else:
                yield b"".join(parts)
    tail = event(encoder.usage(Usage.of(num_prompt, num_completion))) if include_usage else b""
    yield LastEvents(role + last + tail + DONE)
