"""The Host check while auth is off: loopback names, addresses and --allowed-host names pass, others 421."""

from __future__ import annotations

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from middleware.edge.allowed_hosts import AllowedHostsMiddleware, check_allowed_host


async def ok_app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def status(host: str | None, path: str = "/v1/models", allowed: tuple[str, ...] = ()) -> int:
    app = AllowedHostsMiddleware(ok_app, allowed_hosts=allowed)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        request = http.build_request("GET", path)
        if host is None:
            del request.headers["host"]
        else:
            request.headers["host"] = host
        return (await http.send(request)).status_code


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST:8000",
        "localhost.",
        "127.0.0.1",
        "127.0.0.1:8000",
        "[::1]",
        "[::1]:8000",
        "10.1.2.3:8000",
    ],
)
async def test_loopback_names_and_addresses_pass(host: str) -> None:
    assert await status(host) == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example", "", None])
async def test_other_names_get_a_421(host: str | None) -> None:
    assert await status(host) == 421


async def test_the_refusal_is_an_openai_error_naming_the_host() -> None:
    app = AllowedHostsMiddleware(ok_app, allowed_hosts=())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://evil.example") as http:
        reply = await http.get("/v1/models")
    assert reply.status_code == 421
    error = reply.json()["error"]
    assert error["code"] == "host_not_allowed" and "evil.example" in error["message"]


async def test_configured_names_and_their_subdomains_pass() -> None:
    allowed = ("surge.example.com", "*.corp.example")
    assert await status("surge.example.com:443", allowed=allowed) == 200
    assert await status("a.b.corp.example", allowed=allowed) == 200
    assert await status("corp.example", allowed=allowed) == 421  # `*.` is for subdomains only
    assert await status("other.example.com", allowed=allowed) == 421


@pytest.mark.parametrize("path", ["/health", "/ready"])
async def test_probes_pass_whatever_their_host(path: str) -> None:
    assert await status("kubelet.whatever", path) == 200


async def test_metrics_are_not_a_probe() -> None:
    assert await status("evil.example", "/metrics") == 421


def test_allowed_host_values_are_names_without_a_port() -> None:
    assert check_allowed_host("Surge.Example.com.") == "surge.example.com"
    assert check_allowed_host("*") == "*"
    assert check_allowed_host("[::1]") == "[::1]"
    for bad in ("surge.example.com:8000", "http://surge.example.com", "*.*.example", "", "*."):
        with pytest.raises(ValueError, match="allowed-host"):
            check_allowed_host(bad)
    with pytest.raises(ValueError, match="turns the check off"):
        AllowedHostsMiddleware(ok_app, allowed_hosts=("*",))
