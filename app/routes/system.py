"""GET /health (the process is alive), /ready (model loaded, warm, loop alive), /v1/models."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends
from starlette.responses import JSONResponse, Response

from app.state import RETRY_AFTER_SECONDS, ServerState, get_state

router = APIRouter()

_STARTED = int(time.time())


@router.get("/health")
async def health() -> Response:
    # Liveness only: a loading model or a busy engine must not get the pod restarted.
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(state: ServerState = Depends(get_state)) -> Response:
    if state.is_ready:
        return JSONResponse({"status": "ready"})
    error = state.not_ready_error()
    return JSONResponse(
        {"status": "not ready", "reason": error.message},
        status_code=503,
        headers={"Retry-After": str(int(RETRY_AFTER_SECONDS))},
    )


@router.get("/v1/models")
async def list_models(state: ServerState = Depends(get_state)) -> Response:
    settings = state.settings
    engine = state.engine
    max_model_len = engine.config.scheduler.max_model_len if engine is not None else None
    card = {
        "id": settings.model_name,
        "object": "model",
        "created": _STARTED,
        "owned_by": "surge",
        "root": settings.model,
        "max_model_len": max_model_len,
    }
    return JSONResponse({"object": "list", "data": [card]})
