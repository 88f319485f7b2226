"""ApiKeyMiddleware through a real uvicorn server, read by httpx and by the openai SDK."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from starlette.middleware.cors import CORSMiddleware
from starlette.types import Message, Receive, Scope, Send

from app.server.errors import install_error_handlers
from middleware.edge.auth import ApiKeyMiddleware
from tests.live_server import serve_app

KEYS = ["sk-first", "sk-second"]


def build_app(api_keys: list[str]) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, object]:
        return {"object": "list", "data": [], "api_key": getattr(request.state, "api_key", None)}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    # Added first, so it runs inside auth: a preflight must get past auth to reach it.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(ApiKeyMiddleware, api_keys=api_keys)
    return app


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_app(build_app(KEYS)) as url:
        yield url


@pytest.fixture
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=10) as client:
        yield client


def sdk(base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=10)


def assert_unauthorized(response: httpx.Response, message_start: str) -> None:
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_api_key"
    assert error["param"] is None
    assert error["message"].startswith(message_start)


def test_missing_key_is_401(http: httpx.Client) -> None:
    assert_unauthorized(http.get("/v1/models"), "You didn't provide an API key")


@pytest.mark.parametrize("header", ["Bearer sk-wrong", "Bearer", "Basic sk-first", "sk-first", "Bearer sk-firs"])
def test_wrong_key_or_scheme_is_401(http: httpx.Client, header: str) -> None:
    response = http.get("/v1/models", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("key", KEYS)
def test_every_configured_key_is_accepted_and_recorded_in_state(http: httpx.Client, key: str) -> None:
    response = http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200
    assert response.json()["api_key"] == key


def test_scheme_is_case_insensitive(http: httpx.Client) -> None:
    assert http.get("/v1/models", headers={"Authorization": "bearer sk-first"}).status_code == 200


def test_open_paths_need_no_key(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200


def test_cors_preflight_passes_without_a_key(http: httpx.Client) -> None:
    headers = {"Origin": "https://example.com", "Access-Control-Request-Method": "POST"}
    response = http.options("/v1/chat/completions", headers=headers)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "*"


def test_plain_options_is_not_exempt(http: httpx.Client) -> None:
    assert http.options("/v1/models").status_code == 401


def test_sdk_raises_authentication_error(base_url: str) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        sdk(base_url, "sk-wrong").models.list()
    assert info.value.code == "invalid_api_key"
    assert "Incorrect API key provided" in info.value.message


def test_sdk_with_a_good_key_succeeds(base_url: str) -> None:
    assert list(sdk(base_url, "sk-second").models.list()) == []


def test_no_keys_means_auth_is_off() -> None:
    with serve_app(build_app([])) as url:
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 200


@pytest.mark.parametrize("keys", [[""], ["  "]])
def test_blank_keys_are_refused_at_startup(keys: list[str]) -> None:
    with pytest.raises(ValueError):
        ApiKeyMiddleware(build_app([]), api_keys=keys)


async def test_non_http_scopes_pass_through_untouched() -> None:
    seen: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        raise AssertionError("the middleware must not answer a non-HTTP scope")

    middleware = ApiKeyMiddleware(inner, api_keys=KEYS)
    await middleware({"type": "lifespan"}, receive, send)
    await middleware({"type": "websocket", "path": "/ws", "headers": []}, receive, send)
    assert seen == ["lifespan", "websocket"]


async def test_state_is_created_when_the_server_gave_none() -> None:
    scopes: list[Scope] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        scopes.append(scope)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        raise AssertionError("unexpected response")

    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": [(b"authorization", b"Bearer sk-first")]}
    await ApiKeyMiddleware(inner, api_keys=KEYS)(scope, receive, send)
    state = scopes[0]["state"]
    assert state["api_key"] == "sk-first" and state["key_set"].keys == (b"sk-first", b"sk-second")
    assert set(state) == {"api_key", "key_set"}  # the key set it was checked against, for the later layers
