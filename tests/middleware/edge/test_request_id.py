"""X-Request-Id: accepted when sane, generated otherwise, echoed, and on every log line."""

from __future__ import annotations

import io
import json
import logging

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from app.ops.logs import JsonFormatter, RequestIdFilter
from middleware.edge.request_id import (
    MAX_REQUEST_ID_LENGTH,
    RequestIdMiddleware,
    current_request_id,
    is_sane_request_id,
)

log = logging.getLogger("tests.request_id")


async def echo_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers with the request id it sees in the context variable, and logs one line."""
    log.warning("handling %s", scope["path"])
    body = json.dumps({"seen": current_request_id.get(), "state": scope["state"]["request_id"]}).encode()
    # A stale id from the app itself must not survive: the middleware's header wins.
    headers = [(b"content-type", b"application/json"), (b"x-request-id", b"from-the-app")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=RequestIdMiddleware(echo_app)), base_url="http://t")


async def test_a_sane_client_id_is_kept_echoed_and_set_for_the_request() -> None:
    async with client() as http:
        reply = await http.get("/x", headers={"X-Request-Id": "client-id-42"})
    assert reply.headers.get_list("x-request-id") == ["client-id-42"]
    assert reply.json() == {"seen": "client-id-42", "state": "client-id-42"}
    assert current_request_id.get() == ""  # reset after the request


async def test_without_a_client_id_one_is_generated() -> None:
    async with client() as http:
        first = await http.get("/x")
        second = await http.get("/x")
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert ids[0] != ids[1]
    assert all(is_sane_request_id(i) for i in ids)
    assert first.json()["seen"] == ids[0]


@pytest.mark.parametrize(
    "bad",
    ["x" * (MAX_REQUEST_ID_LENGTH + 1), "has space", "tab\there", "", "<script>\x7f"],
)
async def test_an_insane_client_id_is_replaced(bad: str) -> None:
    async with client() as http:
        reply = await http.get("/x", headers={"X-Request-Id": bad})
    echoed = reply.headers["x-request-id"]
    assert echoed != bad
    assert is_sane_request_id(echoed)


async def test_a_non_ascii_client_id_is_replaced() -> None:
    async with client() as http:
        reply = await http.get("/x", headers=[(b"X-Request-Id", "idé".encode())])
    assert is_sane_request_id(reply.headers["x-request-id"])


def test_the_longest_sane_id_is_accepted() -> None:
    assert is_sane_request_id("a" * MAX_REQUEST_ID_LENGTH)


async def test_log_lines_written_during_the_request_carry_its_id() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter())
    log.addHandler(handler)
    try:
        async with client() as http:
            await http.get("/logged", headers={"X-Request-Id": "trace-me"})
        log.warning("outside any request")
    finally:
        log.removeHandler(handler)
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["request_id"] == "trace-me"
    assert inside["message"] == "handling /logged"
    assert {"time", "level", "logger", "message"} <= inside.keys()
    assert "request_id" not in outside


async def test_lifespan_and_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def receive() -> dict[str, str]:
        return {"type": "lifespan.startup"}

    async def send(message: object) -> None:
        raise AssertionError("nothing is sent")

    await RequestIdMiddleware(app)({"type": "lifespan"}, receive, send)  # type: ignore[arg-type]
    assert seen == ["lifespan"]
