"""POST /v1/completions (legacy text completions): JSON and SSE, one or several prompts."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.completions.chunks import CompletionChunkEncoder, CompletionChunks
from app.completions.request import CompletionRequest
from app.generation.collect import ChoiceResult, collect, unless_disconnected
from app.generation.light import light_route
from app.generation.pipeline import start_generation
from app.generation.rendered import generate_request
from app.generation.similar import similar_query
from app.generation.streaming import stream_response
from app.generation.validation import check_text_fits, sampling_params, tokenize_sized
from app.openai import Usage, cached_tokens, new_completion_id
from app.openai.render import completion_logprobs_json, finish_reason_text
from app.response_format import constrain
from app.runtime.body import documented_body, json_body
from app.runtime.state import generation_inputs, render_inputs
from middleware.errors import invalid_request
from models import AsyncEngine, Tokenizer

router = APIRouter()
_parse_body = json_body(CompletionRequest)


def completion_prompts(engine: AsyncEngine, body: CompletionRequest) -> list[list[int]]:
    """Each prompt's token ids (a string tokenized, ids as they are), each checked on its own."""
    vocab_size = engine.tokenizer.vocab_size
    inputs = body.prompt_inputs()
    prompts = []
    for index, item in enumerate(inputs):
        if isinstance(item, str):
            check_text_fits(engine, [item], "prompt")  # each prompt is a sequence of its own
        ids = engine.tokenizer.encode(item) if isinstance(item, str) else list(item)
        if not ids:  # every prompt, not only the longest: the engine cannot start a sequence from nothing
            which = "The prompt" if len(inputs) == 1 else f"Prompt {index}"
            raise invalid_request(f"{which} is empty.", "prompt")
        if any(token_id >= vocab_size for token_id in ids):
            raise invalid_request(f"The prompt has a token id outside the vocabulary (size {vocab_size}).", "prompt")
        prompts.append(ids)
    return prompts


@router.post("/v1/completions/render", response_model=None, openapi_extra=documented_body(CompletionRequest))
async def render_completion(request: Request) -> Response:
    """vLLM's render endpoint: per prompt, its token ids and sampling parameters, nothing generated."""
    body, state, engine = await render_inputs(request, _parse_body)
    prompts = await tokenize_sized(len(await request.body()), lambda: completion_prompts(engine, body))
    rendered = []
    for ids in prompts:
        choices = sampling_params(engine, state.settings, body, [len(ids)], body.requested_max_tokens, "prompt")
        rendered.append(generate_request(new_completion_id(), ids, choices, body.model, body.stream, body.priority))
    return JSONResponse(rendered)


@router.post(
    "/v1/completions",
    response_model=None,
    openapi_extra=documented_body(CompletionRequest),
)
async def create_completion(request: Request) -> Response:
    body, state, engine = await generation_inputs(request, _parse_body)
    prompts = await tokenize_sized(len(await request.body()), lambda: completion_prompts(engine, body))
    num_tokens = sum(len(ids) for ids in prompts)
    if (light := light_route(request, state, engine, num_tokens, body.requested_max_tokens)) is not None:
        engine, body = (
            light.served.engine,
            body.model_copy(update={"model": light.served.name, "max_tokens": light.max_tokens}),
        )
        prompts = await tokenize_sized(len(await request.body()), lambda: completion_prompts(engine, body))
    prompt_lens = [len(ids) for ids in prompts]
    choice_params = sampling_params(engine, state.settings, body, prompt_lens, body.requested_max_tokens, "prompt")
    choice_params = await constrain(state.constraints(request, engine.grammars), body.response_format, choice_params)
    started = await start_generation(
        request,
        state,
        engine,
        prompts,
        choice_params,
        body.priority,
        "completions",
        body.user,
        similar_query(body, "prompt"),
    )
    group, choice_params, headers = started.source, started.choice_params, started.headers
    completion_id = new_completion_id()
    created = int(time.time())
    num_prompt = sum(len(ids) for ids in prompts)
    if body.stream:
        encoder = CompletionChunkEncoder(
            completion_id=completion_id, model=body.model, created=created, include_usage=body.include_usage
        )
        renderer = CompletionChunks(encoder, engine.tokenizer, len(group.request_ids))
        keepalive = state.settings.keepalive_seconds
        return stream_response(group, renderer, num_prompt, keepalive, headers, num_prompts=len(prompts))
    results = await unless_disconnected(request, collect(group))
    want_logprobs = body.logprobs is not None and choice_params[0].logprobs is not None  # level 1 drops them
    return JSONResponse(
        _response_body(
            completion_id, created, body.model, results, engine.tokenizer, num_prompt, len(prompts), want_logprobs
        ),
        headers=headers,
    )


def _response_body(
    completion_id: str,
    created: int,
    model: str,
    results: list[ChoiceResult],
    tokenizer: Tokenizer,
    num_prompt: int,
    num_prompts: int,
    want_logprobs: bool,
) -> dict[str, object]:
    cached = cached_tokens([r.num_cached_tokens for r in results], num_prompts)
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "text": "".join(r.text),
                "logprobs": completion_logprobs_json(tokenizer, r.logprobs, 0) if want_logprobs else None,
                "finish_reason": finish_reason_text(r.finish_reason),
            }
            for i, r in enumerate(results)
        ],
        "usage": Usage.of(num_prompt, sum(len(r.token_ids) for r in results), cached).model_dump(),
    }
