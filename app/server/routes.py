"""Every HTTP route: the system endpoints, then one router per wire protocol.

A protocol is a folder of `app/` with a `route.py` whose `router` translates its wire format to
one generation request (`app/generation/`) and back; serving it is one line in `PROTOCOLS`.
"""

from fastapi import APIRouter

from app.anthropic import route as anthropic
from app.chat import route as chat
from app.completions import route as completions
from app.embeddings import route as embeddings
from app.responses import route as responses
from app.server import system
from app.tokens import route as tokens

PROTOCOLS: tuple[APIRouter, ...] = (chat.router, completions.router, responses.router, anthropic.router)

router = APIRouter()
router.include_router(system.router)
router.include_router(tokens.router)  # vLLM's /tokenize and /detokenize: no generation
router.include_router(embeddings.router)  # OpenAI's /v1/embeddings: the encoder, not the engine
for protocol in PROTOCOLS:
    router.include_router(protocol)
