"""HTTP routes, one module per endpoint family; `router` joins them."""

from fastapi import APIRouter

from app.routes import chat, completions, system

router = APIRouter()
router.include_router(system.router)
router.include_router(chat.router)
router.include_router(completions.router)
