"""POST /v1/completions (legacy text completions): JSON and SSE, one or several prompts."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.body import documented_body, json_body
from app.generation import (
    ChoiceResult,
    ClientDisconnected,
    check_model,
    check_text_fits,
    collect,
    finish_reason_text,
    sampling_params,
    unless_disconnected,
)
from app.pipeline import start_generation
from app.schemas import CompletionChunkEncoder, CompletionRequest, Usage, completion_logprobs, new_completion_id
from app.sse import DONE, KEEPALIVE, LastEvents, error_event, event, sse_response
from app.state import generation_inputs
from middleware.errors import invalid_request
from models.outputs import OutputSource, TokenLogprob
from models.tokenizer import Tokenizer

router = APIRouter()
_parse_body = json_body(CompletionRequest)


@router.post(
    "/v1/completions",
    response_model=None,
    openapi_extra=documented_body(CompletionRequest),
)
async def create_completion(request: Request) -> Response:
    body, state, engine = await generation_inputs(request, _parse_body)
    check_model(state.settings, body.model)
    vocab_size = engine.tokenizer.vocab_size
    prompts: list[list[int]] = []
    inputs = body.prompt_inputs()
    for index, item in enumerate(inputs):
        if isinstance(item, str):
            check_text_fits(engine, [item], "prompt")  # each prompt is a sequence of its own
        ids = engine.tokenizer.encode(item) if isinstance(item, str) else list(item)
        if not ids:  # every prompt, not only the longest: the engine cannot start a sequence from nothing
            raise invalid_request(("The prompt" if len(inputs) == 1 else f"Prompt {index}") + " is empty.", "prompt")
        if any(token_id >= vocab_size for token_id in ids):
            raise invalid_request(f"The prompt has a token id outside the vocabulary (size {vocab_size}).", "prompt")
        prompts.append(ids)
    # The longest prompt decides whether max_tokens fits (and its default, when left out).
    longest = max(len(ids) for ids in prompts)
    choice_params = sampling_params(engine, body, longest, body.requested_max_tokens, "prompt")
    started = await start_generation(request, state, prompts, choice_params, body.priority, "completions")
    group, choice_params, headers = started.source, started.choice_params, started.headers
    completion_id = new_completion_id()
    created = int(time.time())
    num_prompt = sum(len(ids) for ids in prompts)
    if body.stream:
        encoder = CompletionChunkEncoder(
            completion_id=completion_id, model=body.model, created=created, include_usage=body.include_usage
        )
        return sse_response(
            _stream(group, encoder, engine.tokenizer, num_prompt, state.settings.keepalive_seconds, body.include_usage),
            headers,
            on_close=lambda: group.__aexit__(None, None, None),
        )
    try:
        results = await unless_disconnected(request, collect(group))
    except ClientDisconnected:
        return Response(status_code=499)
    want_logprobs = body.logprobs is not None and choice_params[0].logprobs is not None  # level 1 drops them
    return JSONResponse(
        _response_body(completion_id, created, body.model, results, engine.tokenizer, num_prompt, want_logprobs),
        headers=headers,
    )


def _logprobs(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob], offset: int) -> dict[str, object]:
    tokens = [tokenizer.token_text(lp.token_id) for lp in logprobs]
    offsets, position = [], offset
    for token in tokens:
        offsets.append(position)
        position += len(token)
    top = [[(tokenizer.token_text(alt), alt_lp) for alt, alt_lp in lp.top] for lp in logprobs]
    return completion_logprobs(tokens, [lp.logprob for lp in logprobs], top, offsets)


def _response_body(
    completion_id: str,
    created: int,
    model: str,
    results: list[ChoiceResult],
    tokenizer: Tokenizer,
    num_prompt: int,
    want_logprobs: bool,
) -> dict[str, object]:
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "text": "".join(r.text),
                "logprobs": _logprobs(tokenizer, r.logprobs, 0) if want_logprobs else None,
                "finish_reason": finish_reason_text(r.finish_reason),
            }
            for i, r in enumerate(results)
        ],
        "usage": Usage.of(num_prompt, sum(len(r.token_ids) for r in results)).model_dump(),
    }


async def _stream(
    group: OutputSource,
    encoder: CompletionChunkEncoder,
    tokenizer: Tokenizer,
    num_prompt: int,
    keepalive: float,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    num_completion = 0
    offsets = [0] * len(group.request_ids)
    last = b""  # the last tokens go out with the usage and [DONE] (app/sse.py, LastEvents)
    async with group:
        while not group.finished:
            outputs = await group.next_outputs(keepalive)
            if not outputs:
                yield KEEPALIVE
                continue
            parts: list[bytes] = []
            for out in outputs:
                if out.error is not None:
                    yield LastEvents(b"".join(parts) + error_event(out.error) + DONE)
                    return
                index = group.index[out.request_id]
                num_completion += len(out.token_ids)
                logprobs = _logprobs(tokenizer, out.logprobs, offsets[index]) if out.logprobs else None
                offsets[index] += len(out.text)
                if out.text or logprobs or out.finished:
                    reason = finish_reason_text(out.finish_reason)
                    parts.append(event(encoder.text(index, out.text, logprobs=logprobs, finish_reason=reason)))
            if group.finished:
                last = b"".join(parts)
            else:
                yield b"".join(parts)
    tail = event(encoder.usage(Usage.of(num_prompt, num_completion))) if include_usage else b""
    yield LastEvents(last + tail + DONE)
