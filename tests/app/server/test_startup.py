"""Start-up: the port opens at once, /health answers, /ready and the API are 503 until warmup is done."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from app.config.settings import Settings
from app.server.factory import create_app
from models.engine.core import EngineCore
from scripts.harness.servers import wait_until_ready
from tests.live_server import serve_app


def test_ready_is_503_until_warmup_is_done(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    warmup = EngineCore._warmup

    def held_warmup(self: EngineCore) -> None:
        assert release.wait(30)
        warmup(self)

    monkeypatch.setattr(EngineCore, "_warmup", held_warmup)
    # On a thread: the held warmup is patched into this process.
    settings = Settings(
        model=str(tiny_model_dir), served_model_name="m", max_num_seqs=2, max_model_len=128, engine_mode="thread"
    )
    app = create_app(settings)
    with serve_app(app) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        ready = httpx.get(f"{url}/ready")
        assert ready.status_code == 503
        assert "Retry-After" in ready.headers
        body = {"model": "m", "prompt": "hi", "max_tokens": 2}
        refused = httpx.post(f"{url}/v1/completions", json=body)
        assert refused.status_code == 503
        assert "Retry-After" in refused.headers
        release.set()
        wait_until_ready(f"{url}/ready", 30.0)
        assert httpx.post(f"{url}/v1/completions", json=body).status_code == 200
