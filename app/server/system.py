"""GET /health (the process and its engine are alive), /ready (model loaded, warm, loop alive), /v1/models.

`probes` (health and ready) is served on the API port and, with `--metrics-port`, on that one too.
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter, Depends
from starlette.responses import JSONResponse, Response

from app.config.settings import Settings
from app.generation.validation import check_model
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
    engine = state.engine
    if engine is not None and engine.core.dead is not None:
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
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, state: ServerState = Depends(get_state)) -> Response:
    check_model(state.settings, model_id)
    return JSONResponse(_model_card(state))


def _model_card(state: ServerState) -> dict[str, object]:
    settings = state.settings
    engine = state.engine
    return {
        "id": settings.model_name,
        "object": "model",
        "created": _STARTED,
        "owned_by": "surge",
        "root": model_root(settings),
        "max_model_len": engine.config.scheduler.max_model_len if engine is not None else None,
    }


def model_root(settings: Settings) -> str:
    """What the model is, for clients: its hub id when it came from the hub, else the served name.
    Never a local directory's path: that tells a client where the server keeps its files."""
    model = settings.model
    # As the loader decides (models/loading/loader.py): an existing path is a directory, else a hub id.
    if not Path(model).expanduser().exists() and is_repo_id(model):
        return model
    return settings.model_name
