"""The OpenAI API end to end: a real uvicorn server, the official openai SDK and httpx."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from app.config.settings import Settings
from app.server.system import model_root
from tests.live_server import MODEL_NAME, LiveServer, running_server

USER = [{"role": "user", "content": "Tell me about the sea."}]


def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


def test_chat_completion(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=12, temperature=0)
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == MODEL_NAME
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("length", "stop")
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 12
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_stream_with_usage_matches_the_unstreamed_text(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL_NAME, messages=USER, max_tokens=30, temperature=0.9, seed=7)
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    chunks = list(
        client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})  # type: ignore[call-overload]
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    finish = [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == whole.choices[0].message.content
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_ends_with_done_and_sends_no_store_headers(server: LiveServer) -> None:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-store"
        assert response.headers["x-accel-buffering"] == "no"
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])


def test_n_choices(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=8, n=2, seed=3)
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.choices[0].message.content != completion.choices[1].message.content
    stream = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=8, n=2, seed=3, stream=True)
    texts = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in completion.choices]


def test_stop_string_is_not_in_the_output(client: openai.OpenAI) -> None:
    base = dict(model=MODEL_NAME, messages=USER, max_tokens=40, temperature=0)
    full = client.chat.completions.create(**base).choices[0].message.content  # type: ignore[call-overload]
    assert full is not None and len(full) > 12
    stop = full[8:11]
    cut = client.chat.completions.create(**base, stop=[stop, "never-there"])  # type: ignore[call-overload]
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL_NAME, messages=USER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == completion.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        # Greedy picks the most likely token: its logprob is the best of the alternatives.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)


def test_completions_with_several_prompts(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL_NAME, prompt=["Once upon", "In a"], max_tokens=5, n=2, seed=1)
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    assert completion.usage is not None and completion.usage.completion_tokens <= 20
    streamed = client.completions.create(model=MODEL_NAME, prompt="Once upon", max_tokens=5, stream=True, seed=2)
    chunks = list(streamed)
    assert all(c.object == "text_completion" for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_models_health_ready(server: LiveServer, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/ready").status_code == 200


def test_models_never_show_where_the_server_keeps_the_model(server: LiveServer, tiny_model_dir: Path) -> None:
    """The attack surface: `root` in /v1/models was --model as given, for a local directory its path
    on the server (where the files live, the user, the layout). It is the served name now, or the
    hub id for a model from the hub."""
    for path in ("/v1/models", f"/v1/models/{MODEL_NAME}"):
        reply = httpx.get(f"{server.url}{path}")
        assert reply.status_code == 200
        assert str(tiny_model_dir) not in reply.text and tiny_model_dir.name not in reply.text
    assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["root"] == MODEL_NAME
    hub = Settings(model="Qwen/Qwen2.5-0.5B-Instruct", served_model_name="qwen")
    assert model_root(hub) == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_tokens": 600}, "messages"),  # prompt + max_tokens > max_model_len (512)
        ({"temperature": 3.0}, "temperature"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"99999": 5}}, "logit_bias"),
        ({"n": 0}, "n"),
    ],
)
def test_bad_requests_are_400_before_any_stream(client: openai.OpenAI, kwargs: dict[str, object], param: str) -> None:
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL_NAME, messages=USER, stream=stream, **kwargs)  # type: ignore[call-overload]
        assert info.value.status_code == 400
        body = info.value.body
        assert isinstance(body, dict) and body["type"] == "invalid_request_error"
        assert body["param"] == param


def test_context_overflow_has_openai_code(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "word " * 600}])
    assert info.value.code == "context_length_exceeded"


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=USER)
    assert info.value.code == "model_not_found"


def test_unknown_fields_are_ignored(server: LiveServer) -> None:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 3, "some_future_field": {"x": 1}}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert response.status_code == 200


def test_oversized_body_is_413(server: LiveServer, client: openai.OpenAI) -> None:
    huge = "x" * (9 * 1024 * 1024)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": huge}])
    assert info.value.status_code == 413


def test_the_default_body_limit_follows_the_request_budget(server: LiveServer, tiny_model_dir: Path) -> None:
    """The finding: a fixed 8 MiB body limit whatever the model, so a 512-token server parsed
    (on the event loop) 8 MB bodies that could never fit its context. The default is 16 bytes per
    token of the work budget (32 x max_model_len), at least 1 MiB: here 1 MiB."""

    def post(url: str, num_bytes: int) -> httpx.Response:
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x" * num_bytes}], "max_tokens": 1}
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)

    assert post(server.url, 1536 * 1024).status_code == 413
    assert post(server.url, 900 * 1024).json()["error"]["code"] == "context_length_exceeded"
    # A larger budget allows larger bodies: 16 x 200,000 tokens = 3.05 MiB.
    with running_server(tiny_model_dir, max_model_len=512, max_request_tokens=200_000) as big:
        assert post(big.url, 2 * 1024 * 1024).json()["error"]["code"] == "context_length_exceeded"
        assert post(big.url, 4 * 1024 * 1024).status_code == 413


def test_disconnect_mid_stream_frees_the_engine(server: LiveServer) -> None:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 400, "stream": True, "ignore_eos": True}
    aborted = server.engine.core.num_aborted
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        assert server.engine.core.num_running == 1
    server.wait_idle()
    assert server.engine.core.num_aborted == aborted + 1
    # The server serves the next request normally.
    after = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 3})
    assert after.status_code == 200


def test_disconnect_of_a_non_streamed_request_aborts_it(server: LiveServer) -> None:
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 450, "ignore_eos": True}
    aborted = server.engine.core.num_aborted
    done = threading.Event()

    def post() -> None:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=0.15)
        done.set()

    thread = threading.Thread(target=post)
    thread.start()
    deadline = time.monotonic() + 5
    while server.engine.core.num_running == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    thread.join()
    assert done.is_set()
    server.wait_idle(timeout=5)
    assert server.engine.core.num_aborted == aborted + 1


def test_api_keys(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, max_model_len=256, max_num_seqs=2, api_key=("k1", "k2")) as live:
        good = openai.OpenAI(base_url=f"{live.url}/v1", api_key="k2", max_retries=0)
        assert good.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=2).choices
        bad = openai.OpenAI(base_url=f"{live.url}/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=2)
        assert httpx.post(f"{live.url}/v1/chat/completions", json={}).status_code == 401
        assert httpx.get(f"{live.url}/health").status_code == 200
        assert httpx.get(f"{live.url}/ready").status_code == 200


def test_dead_engine_turns_ready_503_and_requests_get_retry_after(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, max_model_len=256, max_num_seqs=2) as live:
        core = live.engine.core

        def broken(*args: object, **kwargs: object) -> None:
            raise SystemError("injected engine bug")

        core._postprocess = broken  # type: ignore[method-assign]
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as first:
            client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=3)
        assert first.value.status_code == 500  # the request that met the failure
        ready = httpx.get(f"{live.url}/ready")
        assert ready.status_code == 503
        health = httpx.get(f"{live.url}/health")  # liveness: a dead engine needs a restart
        assert health.status_code == 503 and health.json()["reason"] == "the engine stopped"
        assert "injected engine bug" not in health.text + str(first.value.body)  # the log has it, not clients
        with pytest.raises(openai.InternalServerError) as after:
            client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=3)
        assert after.value.status_code == 503
        assert after.value.response.headers["retry-after"]


def test_cors_preflight_and_headers(tiny_model_dir: Path) -> None:
    origin = "https://app.example"
    with running_server(
        tiny_model_dir, max_model_len=256, max_num_seqs=2, cors_origin=(origin,), api_key=("k",)
    ) as live:
        preflight = httpx.options(
            f"{live.url}/v1/chat/completions",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == origin
        denied = httpx.post(f"{live.url}/v1/chat/completions", json={}, headers={"Origin": origin})
        assert denied.status_code == 401
        assert denied.headers["access-control-allow-origin"] == origin


def test_logit_bias_forces_a_token(client: openai.OpenAI) -> None:
    forced = 300
    completion = client.completions.create(
        model=MODEL_NAME, prompt="abc", max_tokens=4, temperature=1.0, logit_bias={str(forced): 100}, seed=0
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    plain = client.completions.create(model=MODEL_NAME, prompt="abc", max_tokens=4, temperature=0)
    assert completion.choices[0].text != plain.choices[0].text
    token_text = (
        client.completions.create(
            model=MODEL_NAME, prompt="abc", max_tokens=1, logit_bias={str(forced): 100}, logprobs=0
        )
        .choices[0]
        .logprobs
    )
    assert token_text is not None and token_text.tokens is not None
    assert completion.choices[0].text == token_text.tokens[0] * 4


def test_keepalive_comments_while_queued(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, max_model_len=512, max_num_seqs=1, keepalive_seconds=0.05) as live:
        blocker_body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 300, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=blocker_body) as blocker:
            lines = blocker.iter_lines()
            next(lines)
            queued = {**blocker_body, "max_tokens": 2}
            with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=queued) as waiting:
                seen = []
                for line in waiting.iter_lines():
                    seen.append(line)
                    if line.startswith(": keep-alive"):
                        break
                assert any(line.startswith(": keep-alive") for line in seen)


def test_json_body_without_a_json_content_type(server: LiveServer) -> None:
    # What `curl -d '{...}'` sends: form encoding, yet the body is JSON.
    body = json.dumps({"model": MODEL_NAME, "messages": USER, "max_tokens": 2})
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    response = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers=headers)
    assert response.status_code == 200
    broken = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", headers=headers)
    assert broken.status_code == 400
    assert broken.json()["error"]["type"] == "invalid_request_error"


def test_a_web_page_cannot_post_a_generation_without_a_preflight(server: LiveServer) -> None:
    """The attack: with auth off, any site a user visits could POST text/plain (no CORS preflight)
    to a surge it can reach, and the body was parsed as JSON anyway."""
    url = f"{server.url}/v1/chat/completions"
    body = json.dumps({"model": MODEL_NAME, "messages": USER, "max_tokens": 2})
    steps = server.engine.core.num_steps
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        refused = httpx.post(
            url, content=body, headers={"Origin": "https://evil.example", "Content-Type": content_type}
        )
        assert refused.status_code == 415 and refused.json()["error"]["code"] == "unsupported_media_type"
    assert server.engine.core.num_steps == steps  # nothing ran
    # A page's JSON request (which needs a preflight), and curl -d (no Origin) still work.
    as_json = {"Origin": "https://app.example", "Content-Type": "application/json; charset=utf-8"}
    assert httpx.post(url, content=body, headers=as_json).status_code == 200
    curl = {"Content-Type": "application/x-www-form-urlencoded"}
    assert httpx.post(url, content=body, headers=curl).status_code == 200


def test_a_rebound_host_is_refused_with_auth_off(server: LiveServer) -> None:
    """The attack (DNS rebinding): a page at evil.example has its name resolve to 127.0.0.1, so the
    visitor's browser sends it same-origin requests (Host and Origin evil.example), no CORS rule
    applies, and with auth off (the default on loopback) the page ran generations and read them."""
    url = f"{server.url}/v1/chat/completions"
    body = json.dumps({"model": MODEL_NAME, "messages": USER, "max_tokens": 2})
    rebound = {"Host": "evil.example:8000", "Origin": "http://evil.example:8000", "Content-Type": "application/json"}
    steps = server.engine.core.num_steps
    refused = httpx.post(url, content=body, headers=rebound)
    assert refused.status_code == 421 and refused.json()["error"]["code"] == "host_not_allowed"
    assert httpx.get(f"{server.url}/v1/models", headers={"Host": "evil.example"}).status_code == 421
    assert server.engine.core.num_steps == steps  # nothing ran
    # Probes with any Host (a kubelet's), and loopback names and addresses, still work.
    assert httpx.get(f"{server.url}/health", headers={"Host": "evil.example"}).status_code == 200
    assert httpx.get(f"{server.url}/ready", headers={"Host": "evil.example"}).status_code == 200
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "10.0.0.7:8000"):
        assert (
            httpx.post(url, content=body, headers={"Host": host, "Content-Type": "application/json"}).status_code == 200
        )
