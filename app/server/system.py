"""GET /health (the process and its engine are alive), /ready (model loaded, warm, loop alive), /v1/models.

`probes` (health and ready) is served on the API port and, with `--metrics-port`, on that one too.
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter, Depends
from starlette.responses import JSONResponse, Response

from app.config.settings import Settings
from app.runtime.served import check_model
from app.runtime.state import RETRY_AFTER_SECONDS, ServerState, get_state
from models import ENGINE_STOPPED, is_repo_id

probes = APIRouter()
router = APIRouter()

_STARTED = int(time.time())


@probes.get("/health")
async def health(state: ServerState = Depends(get_state)) -> Response:
    # Liveness: a loading model or a busy engine must not get the pod restarted, but an engine
    # that died (its process killed, its loop crashed) never comes back in this process: a
    # restart is the cure, as with vLLM's /health.
    engines = [served.engine for served in state.models.values()] or ([state.engine] if state.engine else [])
    embeddings_dead = state.embeddings is not None and not state.embeddings.is_alive
    if any(engine.core.dead is not None for engine in engines) or embeddings_dead:
        # The cause is in the log; its text is not for whoever can reach /health.
        return JSONResponse({"status": "engine dead", "reason": ENGINE_STOPPED}, status_code=503)
    return JSONResponse({"status": "ok"})


@probes.get("/ready")
async def ready(state: ServerState = Depends(get_state)) -> Response:
    if state.is_ready:
        return JSONResponse({"status": "ready"})
    error = state.not_ready_error()
    return JSONResponse(
        {"status": "not ready", "reason": error.message},
        status_code=503,
        headers={"Retry-After": str(int(RETRY_AFTER_SECONDS))},
    )


router.include_router(probes)


@router.get("/v1/models")
async def list_models(state: ServerState = Depends(get_state)) -> Response:
    cards = [_model_card(state, name, source) for name, source in state.settings.chat_models]
    if state.settings.embedding_model:
        cards.append(_embedding_card(state))
    return JSONResponse({"object": "list", "data": cards})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, state: ServerState = Depends(get_state)) -> Response:
    settings = state.settings
    if settings.names_embedding_model(model_id):
        return JSONResponse(_embedding_card(state))
    check_model(settings, model_id)
    name = str(settings.chat_model_named(model_id))
    return JSONResponse(_model_card(state, name, dict(settings.chat_models)[name]))


def _embedding_card(state: ServerState) -> dict[str, object]:
    """The encoder's card: its input length and vector size once loaded (None before)."""
    settings = state.settings
    info = state.embeddings.info if state.embeddings is not None else None
    return {
        "id": settings.embedding_model_name,
        "object": "model",
        "created": _STARTED,
        "owned_by": "surge",
        "root": _root(settings.embedding_model, settings.embedding_model_name),
        "max_model_len": info.max_input_tokens if info is not None else None,
        "dimensions": info.dimensions if info is not None else None,
    }


def _model_card(state: ServerState, name: str, source: str) -> dict[str, object]:
    served = state.models.get(name)
    return {
        "id": name,
        "object": "model",
        "created": _STARTED,
        "owned_by": "surge",
        "root": _root(source, name),
        "max_model_len": served.engine.config.scheduler.max_model_len if served is not None else None,
    }


def model_root(settings: Settings) -> str:
    """The main model's `root`."""
    return _root(settings.model, settings.model_name)


def _root(source: str, name: str) -> str:
    """What a model is, for clients: its hub id when it came from the hub, else its served name.
    Never a local directory's path: that tells a client where the server keeps its files."""
    # As the loader decides (models/loading/loader.py): an existing path is a directory, else a hub id.
    if source != "tiny" and not Path(source).expanduser().exists() and is_repo_id(source):
        return source
    return name
