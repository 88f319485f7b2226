"""Draining: after SIGTERM new requests get 503 + Retry-After + Connection: close; probes pass."""

from __future__ import annotations

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from middleware.edge.draining import DrainingMiddleware


async def ok_app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def client(is_draining: list[bool]) -> httpx.AsyncClient:
    app = DrainingMiddleware(ok_app, is_draining=lambda: is_draining[0], retry_after_seconds=5.0)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_requests_pass_until_draining_starts() -> None:
    draining = [False]
    async with client(draining) as http:
        assert (await http.post("/v1/chat/completions", json={})).status_code == 200
        draining[0] = True
        refused = await http.post("/v1/chat/completions", json={})
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "5"
    assert refused.headers["connection"] == "close"
    assert refused.json()["error"]["code"] == "shutting_down"


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
async def test_probes_and_scrapes_still_reach_the_app(path: str) -> None:
    async with client([True]) as http:
        assert (await http.get(path)).status_code == 200


def test_a_negative_retry_after_is_rejected() -> None:
    with pytest.raises(ValueError):
        DrainingMiddleware(ok_app, is_draining=lambda: False, retry_after_seconds=-1)
