"""OpenAI-shaped errors through a real uvicorn server, read by httpx and by the openai SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi import FastAPI
from starlette.types import Message

from app.chat.request import ChatCompletionRequest
from app.server.errors import install_error_handlers
from middleware.errors import (
    OpenAIError,
    error_json,
    invalid_request,
    not_found_model,
    send_error,
    server_error,
    service_unavailable,
)
from tests.live_server import serve_app


def build_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/chat/completions")
    async def chat(request: ChatCompletionRequest) -> dict[str, str]:
        return {"model": request.model}

    @app.get("/v1/models/{model}")
    async def get_model(model: str) -> dict[str, str]:
        raise not_found_model(model)

    @app.get("/invalid")
    async def invalid() -> None:
        raise invalid_request("that was wrong", param="thing", code="bad_thing")

    @app.get("/busy")
    async def busy() -> None:
        raise service_unavailable("server is busy", retry_after=1.5)

    @app.get("/v1/crash")
    async def crash() -> None:
        raise RuntimeError("boom: internal detail")

    return app


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_app(build_app()) as url:
        yield url


@pytest.fixture
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=10) as client:
        yield client


@pytest.fixture
def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=10)


def error_of(response: httpx.Response) -> dict[str, object]:
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, object] = body["error"]
    return error


# -- helpers, no server


def test_error_json_shape() -> None:
    body = json.loads(error_json("é", type="t", param="p", code="c"))
    assert body == {"error": {"message": "é", "type": "t", "param": "p", "code": "c"}}


@pytest.mark.parametrize(
    ("error", "status", "error_type", "code"),
    [
        (invalid_request("x"), 400, "invalid_request_error", None),
        (not_found_model("m"), 404, "invalid_request_error", "model_not_found"),
        (service_unavailable("busy", 2), 503, "server_error", "service_unavailable"),
        (server_error(), 500, "server_error", None),
    ],
)
def test_constructors(error: OpenAIError, status: int, error_type: str, code: str | None) -> None:
    assert (error.status_code, error.type, error.code) == (status, error_type, code)
    assert json.loads(error.to_json())["error"]["message"] == error.message


async def test_send_error_sends_a_complete_response() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    body = error_json("nope", type="invalid_request_error")
    await send_error(send, 418, body, headers=[("X-Extra", "1")])
    assert sent[0]["status"] == 418
    assert (b"x-extra", b"1") in sent[0]["headers"]
    assert (b"content-length", str(len(body)).encode()) in sent[0]["headers"]
    assert sent[1] == {"type": "http.response.body", "body": body, "more_body": False}


# -- through a real server, raw HTTP


def test_openai_error_renders_with_its_status(http: httpx.Client) -> None:
    response = http.get("/invalid")
    assert response.status_code == 400
    assert error_of(response) == {
        "message": "that was wrong",
        "type": "invalid_request_error",
        "param": "thing",
        "code": "bad_thing",
    }


def test_service_unavailable_says_when_to_retry(http: httpx.Client) -> None:
    response = http.get("/busy")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert response.headers["retry-after-ms"] == "1500"
    assert error_of(response)["code"] == "service_unavailable"


def test_validation_error_is_400_with_the_field_path(http: httpx.Client) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": 5}]}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages.0.content"
    assert "messages.0.content" in str(error["message"])


def test_missing_field_message(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json={"model": "m"})
    assert response.status_code == 400
    assert error_of(response)["message"] == "Missing required parameter: 'messages'."


def test_malformed_json_is_400(http: httpx.Client) -> None:
    response = http.post(
        "/v1/chat/completions", content=b'{"model": "m",', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = error_of(response)
    assert "could not parse the JSON body" in str(error["message"])
    assert error["param"] is None


def test_json_that_is_not_an_object_is_400(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=[1, 2])
    assert response.status_code == 400
    assert error_of(response)["type"] == "invalid_request_error"


def test_unknown_url_is_openai_shaped_404(http: httpx.Client) -> None:
    response = http.post("/v1/nowhere", json={})
    assert response.status_code == 404
    assert error_of(response)["message"] == "Invalid URL (POST /v1/nowhere)"


def test_wrong_method_is_openai_shaped_405_with_allow(http: httpx.Client) -> None:
    response = http.get("/v1/chat/completions")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert error_of(response)["message"] == "Method GET is not allowed for /v1/chat/completions"


def test_uncaught_exception_is_openai_shaped_500_without_details(http: httpx.Client) -> None:
    response = http.get("/v1/crash")
    assert response.status_code == 500
    error = error_of(response)
    assert error["type"] == "server_error"
    assert "boom" not in str(error["message"])


# -- through a real server, the official SDK


def test_sdk_raises_bad_request_with_param(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=5)
    assert info.value.status_code == 400
    assert info.value.param == "temperature"
    assert info.value.type == "invalid_request_error"
    assert "temperature" in info.value.message


def test_sdk_raises_not_found_for_unknown_model(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.models.retrieve("no-such-model")
    assert info.value.code == "model_not_found"
    assert "no-such-model" in info.value.message


def test_sdk_raises_internal_server_error(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        sdk.get("/crash", cast_to=object)
    assert info.value.status_code == 500
    assert info.value.type == "server_error"
