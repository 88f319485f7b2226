"""POST /tokenize and /detokenize, as vLLM serves them: a prompt (or a chat conversation, rendered by
the model's template as chat renders it) to token ids, and token ids back to text. Routers and
clients that count or cache tokens call them; nothing is generated, and no traffic layer but
the door's (keys, body size) stands in front.

`/tokenize` takes vLLM's two forms: `prompt` (`add_special_tokens`, default true, as a completion's
prompt gets them) or `messages` (with `tools`, `chat_template_kwargs` and `add_generation_prompt`,
default true, as a chat request is rendered); `return_token_strs` adds each token's text. The
answer: `count`, `max_model_len`, `tokens`, `token_strs`. `model` may be left out (as vLLM's);
named, it must be the served one.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from pydantic import Field, RootModel
from starlette.responses import JSONResponse, Response

from app.chat.request import ChatCompletionRequest
from app.chat.route import chat_prompt
from app.generation.validation import check_text_fits, tokenize_sized
from app.openai.base import RequestModel
from app.openai.limits import MAX_INT
from app.runtime.body import documented_body, json_body
from app.runtime.state import render_inputs
from middleware.errors import invalid_request
from models import AsyncEngine

# Token ids per /detokenize: a long context's worth (a body of ids is bounded by the body limit too).
MAX_DETOKENIZE_TOKENS = 1 << 20

router = APIRouter()


class TokenizeCompletion(RequestModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChat(ChatCompletionRequest):
    model: str | None = None  # type: ignore[assignment]
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class TokenizeRequest(RootModel[TokenizeChat | TokenizeCompletion]):
    """One of the two forms, told apart by `messages` or `prompt`."""


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: Annotated[list[Annotated[int, Field(ge=0, le=MAX_INT)]], Field(max_length=MAX_DETOKENIZE_TOKENS)]


_parse_tokenize = json_body(TokenizeRequest)
_parse_detokenize = json_body(DetokenizeRequest)


@router.post("/tokenize", response_model=None, openapi_extra=documented_body(TokenizeRequest))
async def tokenize(request: Request) -> Response:
    wrapped, _state, engine = await render_inputs(request, _parse_tokenize)
    body = wrapped.root

    def encode() -> list[int]:
        if isinstance(body, TokenizeChat):
            return chat_prompt(engine, body, add_generation_prompt=body.add_generation_prompt)
        check_text_fits(engine, [body.prompt], "prompt")
        hf = engine.tokenizer.hf
        return list(hf.encode(body.prompt, add_special_tokens=body.add_special_tokens))

    tokens = await tokenize_sized(len(await request.body()), encode)
    strs = _token_strs(engine, tokens) if body.return_token_strs else None
    max_model_len = engine.config.scheduler.max_model_len
    return JSONResponse({"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": strs})


@router.post("/detokenize", response_model=None, openapi_extra=documented_body(DetokenizeRequest))
async def detokenize(request: Request) -> Response:
    body, _state, engine = await render_inputs(request, _parse_detokenize)
    vocab_size = engine.tokenizer.vocab_size
    if any(token >= vocab_size for token in body.tokens):
        raise invalid_request(f"A token id is outside the vocabulary (size {vocab_size}).", param="tokens")
    text = await tokenize_sized(len(await request.body()), lambda: engine.tokenizer.decode(body.tokens))
    return JSONResponse({"prompt": text})


def _token_strs(engine: AsyncEngine, tokens: list[int]) -> list[str]:
    return [str(piece) for piece in engine.tokenizer.hf.convert_ids_to_tokens(tokens)]
