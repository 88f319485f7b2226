"""POST /v1/chat/completions: JSON and SSE."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.body import documented_body, json_body
from app.collect import ChoiceResult, ClientDisconnected, collect, unless_disconnected
from app.pipeline import start_generation
from app.render import chat_logprobs_json, finish_reason_text
from app.response_format import constrain
from app.schemas import ChatChunkEncoder, ChatCompletionRequest, Usage, new_chat_completion_id
from app.sse import event, sse_response
from app.state import generation_inputs
from app.streaming import stream_events
from app.validation import check_model, check_text_fits, sampling_params
from middleware.errors import invalid_request
from models.async_engine import AsyncEngine
from models.outputs import RequestOutput
from models.tokenizer import Tokenizer

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
    choice_params = await constrain(engine.grammars, body.response_format, choice_params, state.constrained_requests)
    started = await start_generation(request, state, [prompt], choice_params, body.priority, "chat")
    group, choice_params, headers = started.source, started.choice_params, started.headers
    completion_id = new_chat_completion_id()
    created = int(time.time())
    if body.stream:
        encoder = ChatChunkEncoder(
            completion_id=completion_id, model=body.model, created=created, include_usage=body.include_usage
        )
        events = stream_events(
            group,
            _ChatChunks(encoder, engine.tokenizer),
            len(prompt),
            state.settings.keepalive_seconds,
            body.include_usage,
        )
        return sse_response(
            events,
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
                # `refusal` is required by OpenAI's schema: null, surge never refuses.
                "message": {"role": "assistant", "content": "".join(r.text), "refusal": None},
                "logprobs": (
                    {"content": chat_logprobs_json(engine.tokenizer, r.logprobs), "refusal": None}
                    if want_logprobs
                    else None
                ),
                "finish_reason": finish_reason_text(r.finish_reason),
            }
            for i, r in enumerate(results)
        ],
        "usage": Usage.of(num_prompt, num_completion).model_dump(),
    }


class _ChatChunks:
    """A chat stream's chunks: the role first, then content deltas with their logprobs, then the finish."""

    def __init__(self, encoder: ChatChunkEncoder, tokenizer: Tokenizer) -> None:
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.usage = encoder.usage

    def opening(self, num_choices: int) -> bytes:
        return b"".join(event(self.encoder.role(i)) for i in range(num_choices))

    def render(self, index: int, output: RequestOutput) -> bytes:
        logprobs = chat_logprobs_json(self.tokenizer, output.logprobs) if output.logprobs else None
        events = b""
        if output.text or logprobs:
            events = event(self.encoder.delta(index, output.text, logprobs=logprobs))
        if output.finished:
            reason = finish_reason_text(output.finish_reason)
            events += event(self.encoder.delta(index, None, finish_reason=reason))
        return events
