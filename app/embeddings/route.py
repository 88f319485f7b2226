"""POST /v1/embeddings: inputs to the served encoder's unit vectors, in OpenAI's response shape.

Every refusal comes before any work: an unknown model 404, the chat model named (it embeds
nothing) or an input the encoder cannot read (too long without `truncate_prompt_tokens`, a token
id outside its vocabulary, `dimensions` it does not allow) 400, over the key's tokens per minute
429, the encoder's queue full 503 with Retry-After. The door's layers stand in front as on the
generation routes (keys, body size, requests per minute, concurrency, idempotency keys); the
inputs' tokens are charged to the key's tokens bucket, as OpenAI counts them.
"""

from __future__ import annotations

import base64
import logging
import sys
from array import array

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from app.embeddings.request import MAX_REQUEST_TOKENS, EmbeddingRequest
from app.generation.validation import PREFIX_CHARS_PER_TOKEN, tokenize_sized
from app.runtime.body import documented_body, json_body
from app.runtime.state import RETRY_AFTER_SECONDS, ServerState
from middleware.errors import invalid_request, not_found_model, service_unavailable
from middleware.rate_limit.tokens import reserve_tokens
from models import Embedder, EmbeddingQueueFull

log = logging.getLogger("surge.embedding")

router = APIRouter()

_parse = json_body(EmbeddingRequest)


@router.post("/v1/embeddings", response_model=None, openapi_extra=documented_body(EmbeddingRequest))
async def create_embeddings(request: Request) -> Response:
    body = await _parse(request)
    state: ServerState = request.app.state.surge
    embeddings = embedding_engine(state, body.model)
    info = embeddings.info
    if body.dimensions is not None and (why := info.check_dimensions(body.dimensions)) is not None:
        raise invalid_request(why, param="dimensions")
    inputs = body.inputs()
    token_ids = await tokenize_sized(len(await request.body()), lambda: _token_ids(embeddings, inputs, body))
    num_tokens = sum(len(ids) for ids in token_ids)
    if num_tokens > MAX_REQUEST_TOKENS:
        raise invalid_request(
            f"The inputs hold {num_tokens} tokens; at most {MAX_REQUEST_TOKENS} per request (send more requests).",
            param="input",
        )
    reservation = await reserve_tokens(request.scope, num_tokens)
    try:
        vectors = await embeddings.embed(token_ids, body.dimensions)
    except EmbeddingQueueFull:
        await reservation.settle(0)
        raise service_unavailable("The embedding model is busy; retry shortly.", RETRY_AFTER_SECONDS) from None
    except RuntimeError as exc:  # its process ended, or a forward pass failed: the cause is in the log
        await reservation.settle(0)
        log.warning("embedding failed: %s", exc)
        raise service_unavailable("The embedding model is not available.", RETRY_AFTER_SECONDS) from None
    except BaseException:
        await reservation.settle(0)
        raise
    await reservation.settle(num_tokens)
    data = [
        {"object": "embedding", "index": index, "embedding": _encoded(vector, body.encoding_format)}
        for index, vector in enumerate(vectors)
    ]
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": state.settings.embedding_model_name,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }
    )


def embedding_engine(state: ServerState, model: str) -> Embedder:
    """The encoder `model` names, or the request's refusal: 404 unknown, 400 the chat model, 503 loading."""
    settings = state.settings
    if not settings.names_embedding_model(model):
        if settings.chat_model_named(model) is not None:
            served = f" Embedding models here: {settings.embedding_model_name}." if settings.embedding_model else ""
            raise invalid_request(
                f"The model `{model}` does not support embeddings: it is a chat model.{served}", param="model"
            )
        raise not_found_model(model)
    if state.embeddings is None or state.is_shutting_down:
        raise state.not_ready_error()
    return state.embeddings


def _token_ids(encoder: Embedder, inputs: list[str | list[int]], body: EmbeddingRequest) -> list[list[int]]:
    """Each input's token ids, cut to `truncate_prompt_tokens` (the last ones), checked against the
    encoder's length and vocabulary."""
    info = encoder.info
    keep = body.truncate_prompt_tokens
    if keep is not None and (keep == -1 or keep > info.max_input_tokens):
        keep = info.max_input_tokens
    # A text this long cannot fit (no tokenizer we know packs more characters in a token on
    # average): refused, or cut, before tokenizing megabytes.
    max_chars = info.max_input_tokens * PREFIX_CHARS_PER_TOKEN
    result = []
    for index, item in enumerate(inputs):
        if isinstance(item, str):
            if len(item) > max_chars:
                if keep is None:
                    raise _too_long(info.max_input_tokens, None, index)
                item = item[-max_chars:]
            ids = encoder.encode_text(item)
        else:
            ids = item
            if (bad := next((t for t in ids if t >= info.vocab_size), None)) is not None:
                raise invalid_request(
                    f"Token id {bad} in input {index} is outside the model's vocabulary (0 to {info.vocab_size - 1}).",
                    param="input",
                )
        if keep is not None and len(ids) > keep:
            ids = ids[-keep:]
        if len(ids) > info.max_input_tokens:
            raise _too_long(info.max_input_tokens, len(ids), index)
        result.append(ids)
    return result


def _too_long(limit: int, num_tokens: int | None, index: int) -> Exception:
    requested = f"{num_tokens} tokens" if num_tokens is not None else "more tokens than that"
    return invalid_request(
        f"This model's maximum context length is {limit} tokens, however you requested {requested} in input"
        f" {index}. Please reduce the input, or set truncate_prompt_tokens.",
        param="input",
        code="context_length_exceeded",
    )


def _encoded(vector: array[float], encoding_format: str) -> list[float] | str:
    """JSON numbers, or base64 of little-endian float32s (what the openai SDK decodes)."""
    if encoding_format == "float":
        return vector.tolist()
    if sys.byteorder == "big":
        vector = array("f", vector)
        vector.byteswap()
    return base64.b64encode(vector.tobytes()).decode("ascii")
