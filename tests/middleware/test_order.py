"""middleware/__init__.py: the one order of the traffic layers, and what the package may import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.config.settings import Settings
from app.server.factory import create_app
from middleware import AFTER_PARSE, DOOR
from middleware.edge.allowed_hosts import AllowedHostsMiddleware
from middleware.edge.auth import ApiKeyMiddleware
from middleware.edge.request_id import RequestIdMiddleware
from middleware.generation import Generation, Handler, chain
from middleware.idempotency.asgi import IdempotencyMiddleware
from middleware.rate_limit.asgi import RateLimitMiddleware
from middleware.rate_limit.concurrency import ConcurrencyMiddleware
from models.engine.outputs import OutputSource

ROOT = Path(__file__).resolve().parents[2]


def test_no_layer_imports_the_engine_torch_or_fastapi() -> None:
    code = (
        "import importlib, pkgutil, sys, middleware\n"
        "for info in pkgutil.walk_packages(middleware.__path__, 'middleware.'):\n"
        "    importlib.import_module(info.name)\n"
        # The engine's face (models/__init__.py) and the torch-free modules behind what middleware uses.
        "allowed = {'models', 'models.engine', 'models.engine.outputs', 'models.load', 'models.load.stats',\n"
        "           'models.sampling', 'models.sampling.params', 'models.sampling.logprobs',\n"
        "           'models.scheduler', 'models.scheduler.sequence'}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'fastapi')\n"
        "             or (m.split('.')[0] == 'models' and m not in allowed))\n"
        "print(bad)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_app_stacks_the_door_layers_in_the_declared_order(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-a: {rpm: 10, max_concurrent: 4}\n")
    settings = Settings(model="echo", cors_origin=("*",), keys_file=str(keys))
    app = create_app(settings)
    # Starlette keeps user middleware outermost first.
    stacked = [entry.cls for entry in app.user_middleware]
    assert stacked[0] is RequestIdMiddleware and stacked[-1] is IdempotencyMiddleware
    assert stacked.index(ApiKeyMiddleware) < stacked.index(RateLimitMiddleware) < stacked.index(IdempotencyMiddleware)
    assert (
        stacked.index(RateLimitMiddleware) < stacked.index(ConcurrencyMiddleware) < stacked.index(IdempotencyMiddleware)
    )
    # Every layer on (CORS, rate limits, concurrency) but the Host check: auth is on, the key protects.
    assert AllowedHostsMiddleware not in stacked and len(stacked) == len(DOOR) - 1


def test_a_layer_that_is_off_is_left_out() -> None:
    app = create_app(Settings(model="echo"))
    stacked = [entry.cls for entry in app.user_middleware]
    assert RateLimitMiddleware not in stacked and len(stacked) == len(DOOR) - 3  # no CORS, rate or concurrency limit
    assert AllowedHostsMiddleware in stacked  # auth is off: the Host check is on
    assert AllowedHostsMiddleware not in [e.cls for e in create_app(Settings(allowed_host=("*",))).user_middleware]


async def test_chain_runs_layers_outermost_first_around_the_innermost() -> None:
    seen: list[str] = []

    class Layer:
        def __init__(self, name: str) -> None:
            self.name = name

        async def __call__(self, generation: Generation, call_next: Handler) -> OutputSource:
            seen.append(f"{self.name} in")
            try:
                return await call_next(generation)
            finally:
                seen.append(f"{self.name} out")

    async def innermost(generation: Generation) -> OutputSource:
        seen.append("engine")
        return object()  # type: ignore[return-value]

    handler = chain([Layer(name) for name in AFTER_PARSE], innermost)
    await handler(Generation({}, None, "chat", [[1]], [], 0))  # type: ignore[arg-type]
    names = list(AFTER_PARSE)
    assert seen == [f"{n} in" for n in names] + ["engine"] + [f"{n} out" for n in reversed(names)]
