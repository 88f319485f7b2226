"""A catalogue of bad requests: each gets OpenAI's error, with its status, before any stream opens.

Every case runs against both endpoints where it applies, streamed and not, through a real
server with API keys and a tokens-per-minute limit on. None of them may reach the model (the
engine's step counter stays put) or cost tokens from the caller's bucket; a request takes 1
from the requests bucket before its body is read (docs/traffic.md, "Rate limits"), which is why the
requests limit is left off here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live_server import MODEL_NAME, LiveServer, running_server

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
KEY = "sk-catalogue"
METER_KEY = "sk-meter"  # a caller of its own, so its tokens bucket is full when its test starts
TPM = 600  # refills 10 tokens a second: a bad request that cost tokens would show for seconds
MAX_MODEL_LEN = 64
OUTPUT_BUDGET = 2000  # --max-request-output-tokens
JSON_ERROR = "We could not parse the JSON body of your request"
CONTEXT = "maximum context length is 64 tokens"

USER = [{"role": "user", "content": "Hi"}]
BASE: dict[str, dict[str, Any]] = {
    CHAT: {"model": MODEL_NAME, "messages": USER, "max_tokens": 4},
    COMPLETIONS: {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 4},
}
BOTH = (CHAT, COMPLETIONS)
CHAT_ONLY = (CHAT,)
COMPLETIONS_ONLY = (COMPLETIONS,)


@dataclass(frozen=True)
class Bad:
    """One bad request: the base body of each endpoint changed as given, and what must come back."""

    name: str
    status: int
    message: str  # a fragment of error.message
    param: str | None
    fields: dict[str, Any] = field(default_factory=dict)  # merged into the base body
    drop: tuple[str, ...] = ()  # removed from the base body
    raw: str = ""  # JSON text appended inside the body object (NaN, lone surrogates, ...)
    body: bytes | Callable[[], Iterator[bytes]] | None = None  # the whole body instead
    headers: dict[str, Any] = field(default_factory=dict)
    code: str | None = None
    error_type: str = "invalid_request_error"
    endpoints: tuple[str, ...] = BOTH
    is_streamable: bool = True  # False: the body ignores `stream`, one run per endpoint is enough

    def content(self, path: str, stream: bool) -> bytes | Iterator[bytes]:
        if self.body is not None:
            return self.body if isinstance(self.body, bytes) else self.body()
        body = {key: value for key, value in BASE[path].items() if key not in self.drop}
        body["stream"] = stream
        body.update(self.fields)
        text = json.dumps(body)
        if self.raw:
            text = text[:-1] + ", " + self.raw + "}"
        return text.encode()


def messages(count: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"message {i}"} for i in range(count)]


def calls(count: int) -> list[dict[str, Any]]:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [{"role": "assistant", "content": None, "tool_calls": [call] * count}, *USER]


def biases(count: int) -> dict[str, int]:
    return {str(token_id): 1 for token_id in range(count)}


# The validation bomb: ~8 MB of bad items, each of which pydantic used to report (millions of
# errors, seconds of event loop, gigabytes); now it stops at the cap.
BOMB = ["x"] * 1_600_000


def chunked(data: bytes, size: int = 1 << 20) -> Callable[[], Iterator[bytes]]:
    """A body sent without Content-Length (a generator makes httpx send it chunked)."""

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(data), size):
            yield data[start : start + size]

    return chunks


SURROGATE_UTF8 = b"\xed\xa0\x80"  # U+D800 encoded as if it were a character, which UTF-8 forbids
TEN_MB = b'{"model": "x", "prompt": "' + b"a" * 10_000_000 + b'"}'

CATALOGUE = [
    # Not JSON, or not an object.
    Bad("invalid-json", 400, JSON_ERROR, None, body=b'{"model": "tiny-test", "messages": [', is_streamable=False),
    Bad("empty-body", 400, JSON_ERROR, None, body=b"", is_streamable=False),
    Bad("invalid-utf8", 400, JSON_ERROR, None, body=b'{"model": "\xff\xfe"}', is_streamable=False),
    Bad("json-array", 400, "Input should be an object", None, body=b"[]", is_streamable=False),
    Bad("deep-nesting", 400, JSON_ERROR, None, body=b"[" * 100_000 + b"]" * 100_000, is_streamable=False),
    # Missing fields and wrong types.
    Bad("missing-model", 400, "Missing required parameter: 'model'", "model", drop=("model",)),
    Bad("missing-messages", 400, "Missing required parameter: 'messages'", "messages", drop=("messages",),
        endpoints=CHAT_ONLY),
    Bad("missing-prompt", 400, "Missing required parameter: 'prompt'", "prompt", drop=("prompt",),
        endpoints=COMPLETIONS_ONLY),
    Bad("model-not-a-string", 400, "valid string", "model", {"model": 123}),
    Bad("messages-not-a-list", 400, "valid array", "messages", {"messages": "Hi"}, endpoints=CHAT_ONLY),
    Bad("prompt-not-text-or-ids", 400, "prompt must be", "prompt", {"prompt": {"text": "Hi"}},
        endpoints=COMPLETIONS_ONLY),
    Bad("prompt-negative-token-id", 400, "prompt must be", "prompt", {"prompt": [1, -2]}, endpoints=COMPLETIONS_ONLY),
    Bad("prompt-token-id-out-of-vocabulary", 400, "outside the vocabulary", "prompt", {"prompt": [10**9]},
        endpoints=COMPLETIONS_ONLY),
    Bad("prompt-token-id-past-int32", 400, "less than or equal to 2147483647", "prompt.0", {"prompt": [10**12]},
        endpoints=COMPLETIONS_ONLY),
    Bad("empty-prompt", 400, "The prompt is empty", "prompt", {"prompt": ""}, endpoints=COMPLETIONS_ONLY),
    Bad("empty-prompt-in-a-list", 400, "Prompt 1 is empty", "prompt", {"prompt": ["Hi", ""]},
        endpoints=COMPLETIONS_ONLY),
    Bad("max-tokens-not-an-int", 400, "valid integer", "max_tokens", {"max_tokens": "ten"}),
    Bad("max-tokens-a-fraction", 400, "valid integer", "max_tokens", {"max_tokens": 1.5}),
    Bad("n-zero", 400, "greater than or equal to 1", "n", {"n": 0}),
    Bad("n-too-many", 400, "less than or equal to 16", "n", {"n": 17}),
    Bad("stream-not-a-bool", 400, "valid boolean", "stream", {"stream": [True]}, is_streamable=False),
    Bad("stream-options-without-stream", 400, "only allowed when stream is true", "stream_options",
        {"stream_options": {"include_usage": True}}, is_streamable=False),
    # Messages.
    Bad("empty-messages", 400, "at least 1 item", "messages", {"messages": []}, endpoints=CHAT_ONLY),
    Bad("unknown-role", 400, "'system', 'developer', 'user', 'assistant' or 'tool'", "messages.0.role",
        {"messages": [{"role": "wizard", "content": "Hi"}]}, endpoints=CHAT_ONLY),
    Bad("missing-role", 400, "Missing required parameter: 'messages.0.role'", "messages.0.role",
        {"messages": [{"content": "Hi"}]}, endpoints=CHAT_ONLY),
    Bad("user-without-content", 400, "content is required for a 'user' message", "messages.0",
        {"messages": [{"role": "user"}]}, endpoints=CHAT_ONLY),
    Bad("unknown-content-part", 400, "'text'", "messages.0.content.0.type",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        endpoints=CHAT_ONLY),
    Bad("four-thousand-messages", 400, CONTEXT, "messages", {"messages": messages(4000)},
        code="context_length_exceeded", endpoints=CHAT_ONLY),
    # Caps on every list and map (app/openai/limits.py).
    Bad("ten-thousand-messages", 400, "at most 4096 items", "messages", {"messages": messages(10_000)},
        endpoints=CHAT_ONLY),
    Bad("257-content-parts", 400, "at most 256 items", "messages.0.content",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 257}]}, endpoints=CHAT_ONLY),
    Bad("129-calls-in-one-turn", 400, "at most 128 items", "messages.0.tool_calls", {"messages": calls(129)},
        endpoints=CHAT_ONLY),
    Bad("65-chat-template-kwargs", 400, "at most 64 items", "chat_template_kwargs",
        {"chat_template_kwargs": {f"k{i}": 1 for i in range(65)}}, endpoints=CHAT_ONLY),
    Bad("stop-token-ids-bomb", 400, "at most 128 items", "stop_token_ids", {"stop_token_ids": BOMB}),
    Bad("129-stop-token-ids", 400, "at most 128 items", "stop_token_ids", {"stop_token_ids": list(range(129))}),
    Bad("logit-bias-bomb", 400, "at most 300 items", "logit_bias", {"logit_bias": biases(400_000)}),
    Bad("301-logit-bias-entries", 400, "at most 300 items", "logit_bias", {"logit_bias": biases(301)}),
    Bad("a-513-character-stop", 400, "at most 512 characters", "stop", {"stop": "s" * 513}),
    Bad("a-513-character-stop-in-a-list", 400, "at most 512 characters", "stop.0", {"stop": ["s" * 513]}),
    Bad("129-prompts", 400, "at most 128 prompts per request", "prompt", {"prompt": ["Hi"] * 129},
        endpoints=COMPLETIONS_ONLY),
    Bad("prompts-bomb", 400, "at most 128 prompts per request", "prompt", {"prompt": BOMB},
        endpoints=COMPLETIONS_ONLY),
    Bad("prompts-times-n", 400, "at most 256 sequences per request", None, {"prompt": ["Hi"] * 20, "n": 16},
        endpoints=COMPLETIONS_ONLY),
    # The request budget (app/runtime/request_budget.py): 32 x 64 tokens of work, OUTPUT_BUDGET of output.
    Bad("work-past-the-request-budget", 400, "the server allows 2048 per request", "max_tokens",
        {"prompt": ["Hi"] * 128, "n": 2, "max_tokens": 8}, endpoints=COMPLETIONS_ONLY),
    Bad("n-times-max-tokens-times-top-logprobs", 400, "output tokens and log probabilities", "max_tokens",
        {"n": 16, "max_tokens": 10, "logprobs": True, "top_logprobs": 20}, endpoints=CHAT_ONLY),
    Bad("n-times-max-tokens-times-logprobs", 400, "output tokens and log probabilities", "max_tokens",
        {"n": 16, "max_tokens": 10, "logprobs": 20}, endpoints=COMPLETIONS_ONLY),
    # NaN and infinities, as Python's json writes them.
    Bad("temperature-nan", 400, "finite number", "temperature", raw='"temperature": NaN'),
    Bad("temperature-infinity", 400, "finite number", "temperature", raw='"temperature": Infinity'),
    Bad("top-p-negative-infinity", 400, "finite number", "top_p", raw='"top_p": -Infinity'),
    Bad("presence-penalty-nan", 400, "finite number", "presence_penalty", raw='"presence_penalty": NaN'),
    Bad("logit-bias-nan", 400, "finite number", "logit_bias", raw='"logit_bias": {"1": NaN}'),
    Bad("max-tokens-infinity", 400, "finite number", "max_tokens", drop=("max_tokens",), raw='"max_tokens": Infinity'),
    # Out of range.
    Bad("max-tokens-negative", 400, "greater than or equal to 1", "max_tokens", {"max_tokens": -1}),
    Bad("max-tokens-zero", 400, "greater than or equal to 1", "max_tokens", {"max_tokens": 0}),
    Bad("max-tokens-huge", 400, CONTEXT, "messages", {"max_tokens": 10**9}, code="context_length_exceeded",
        endpoints=CHAT_ONLY),
    Bad("max-tokens-huge", 400, CONTEXT, "prompt", {"max_tokens": 10**9}, code="context_length_exceeded",
        endpoints=COMPLETIONS_ONLY),
    # The attack: 4,300 digits parse as JSON, and used to be a 500 (int-to-str limit in the 400's text).
    Bad("max-tokens-4300-digits", 400, "less than or equal to 2147483647", "max_tokens", drop=("max_tokens",),
        raw='"max_tokens": ' + "9" * 4300),
    Bad("max-tokens-past-int32", 400, "less than or equal to 2147483647", "max_tokens", {"max_tokens": 10**30}),
    Bad("max-completion-tokens-huge", 400, CONTEXT, "messages", {"max_completion_tokens": 10**6},
        code="context_length_exceeded", endpoints=CHAT_ONLY),
    Bad("max-tokens-past-json-range", 400, JSON_ERROR, None, drop=("max_tokens",), raw='"max_tokens": ' + "9" * 5000),
    Bad("temperature-negative", 400, "greater than or equal to 0", "temperature", {"temperature": -0.1}),
    Bad("temperature-above-2", 400, "less than or equal to 2", "temperature", {"temperature": 2.01}),
    Bad("top-p-negative", 400, "greater than or equal to 0", "top_p", {"top_p": -0.5}),
    Bad("top-p-above-1", 400, "less than or equal to 1", "top_p", {"top_p": 1.5}),
    Bad("five-stop-strings", 400, "at most 4 items", "stop", {"stop": ["a", "b", "c", "d", "e"]}),
    Bad("top-logprobs-above-20", 400, "less than or equal to 20", "top_logprobs",
        {"logprobs": True, "top_logprobs": 21}, endpoints=CHAT_ONLY),
    Bad("top-logprobs-without-logprobs", 400, "top_logprobs requires logprobs to be true", "top_logprobs",
        {"top_logprobs": 2}, endpoints=CHAT_ONLY),
    Bad("legacy-logprobs-above-20", 400, "less than or equal to 20", "logprobs", {"logprobs": 21},
        endpoints=COMPLETIONS_ONLY),
    Bad("logit-bias-above-100", 400, "between -100 and 100", "logit_bias", {"logit_bias": {"1": 101}}),
    Bad("logit-bias-below-minus-100", 400, "between -100 and 100", "logit_bias", {"logit_bias": {"1": -100.5}}),
    Bad("logit-bias-word-key", 400, "logit_bias keys must be token ids", "logit_bias", {"logit_bias": {"hello": 1}}),
    Bad("logit-bias-negative-key", 400, "logit_bias keys must be token ids", "logit_bias", {"logit_bias": {"-1": 1}}),
    Bad("logit-bias-superscript-key", 400, "logit_bias keys must be token ids", "logit_bias", {"logit_bias": {"²": 1}}),
    Bad("logit-bias-5000-digit-key", 400, "logit_bias keys must be token ids", "logit_bias",
        {"logit_bias": {"9" * 5000: 1}}),
    Bad("logit-bias-key-out-of-vocabulary", 400, "out of vocabulary", "logit_bias", {"logit_bias": {"99999999": 1}}),
    Bad("stop-token-id-out-of-vocabulary", 400, "out of vocabulary", "stop_token_ids", {"stop_token_ids": [10**9]}),
    Bad("stop-token-id-negative", 400, "greater than or equal to 0", "stop_token_ids.0", {"stop_token_ids": [-1]}),
    Bad("seed-out-of-range", 400, "less than or equal to", "seed", {"seed": 2**64}),
    Bad("echo", 400, "echo is not supported", "echo", {"echo": True}, endpoints=COMPLETIONS_ONLY),
    # Lone surrogates, escaped in JSON, and as raw UTF-8 bytes (which UTF-8 forbids).
    Bad("lone-high-surrogate-in-content", 400, JSON_ERROR, None, drop=("messages",),
        raw='"messages": [{"role": "user", "content": "a\\ud800b"}]', endpoints=CHAT_ONLY),
    Bad("lone-low-surrogate-in-content", 400, JSON_ERROR, None, drop=("messages",),
        raw='"messages": [{"role": "user", "content": "\\udc00"}]', endpoints=CHAT_ONLY),
    Bad("lone-surrogate-in-prompt", 400, JSON_ERROR, None, drop=("prompt",), raw='"prompt": "\\ud800"',
        endpoints=COMPLETIONS_ONLY),
    Bad("lone-surrogate-in-model", 400, JSON_ERROR, None, drop=("model",), raw='"model": "\\ud800"'),
    Bad("surrogate-as-raw-bytes", 400, JSON_ERROR, None, is_streamable=False,
        body=b'{"model": "tiny-test", "prompt": "' + SURROGATE_UTF8 + b'", "messages": [{"role": "user", "content": "'
        + SURROGATE_UTF8 + b'"}]}'),
    # A web page's simple POST (no CORS preflight): a browser request must be JSON.
    Bad("cross-site-text-plain", 415, "must send its body as Content-Type: application/json", None,
        headers={"Origin": "https://evil.example", "Content-Type": "text/plain"}, code="unsupported_media_type"),
    Bad("cross-site-form", 415, "must send its body as Content-Type: application/json", None,
        headers={"Origin": "https://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
        code="unsupported_media_type"),
    # The model, the key, the body's size, the Idempotency-Key.
    Bad("unknown-model", 404, "The model `gpt-imaginary` does not exist", "model", {"model": "gpt-imaginary"},
        code="model_not_found"),
    Bad("wrong-api-key", 401, "Incorrect API key provided", None, headers={"Authorization": "Bearer sk-wrong"},
        code="invalid_api_key"),
    Bad("missing-api-key", 401, "You didn't provide an API key", None, headers={"Authorization": ""},
        code="invalid_api_key"),
    Bad("ten-mb-body", 413, "Request body too large", None, body=TEN_MB, code="payload_too_large", is_streamable=False),
    Bad("ten-mb-chunked-body", 413, "Request body too large", None, body=chunked(TEN_MB), code="payload_too_large",
        is_streamable=False),
    Bad("overlong-idempotency-key", 400, "Idempotency-Key", None, headers={"Idempotency-Key": "k" * 256},
        code="invalid_idempotency_key"),
    Bad("empty-idempotency-key", 400, "Idempotency-Key", None, headers={"Idempotency-Key": ""},
        code="invalid_idempotency_key"),
    Bad("non-ascii-idempotency-key", 400, "Idempotency-Key", None, headers={"Idempotency-Key": b"caf\xe9"},
        code="invalid_idempotency_key"),
    Bad("idempotency-key-with-a-tab", 400, "Idempotency-Key", None, headers={"Idempotency-Key": "a\tb"},
        code="invalid_idempotency_key"),
]  # fmt: skip


def runs() -> Iterator[Any]:
    for bad in CATALOGUE:
        for path in bad.endpoints:
            for stream in (False, True) if bad.is_streamable else (False,):
                name = f"{bad.name}-{'chat' if path == CHAT else 'completions'}" + ("-stream" if stream else "")
                yield pytest.param(bad, path, stream, id=name)


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(
        tiny_model_dir,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=4,
        api_key=(KEY, METER_KEY),
        rate_limit_tpm=TPM,
        dedup_ttl_seconds=0,
        max_request_output_tokens=OUTPUT_BUDGET,
        # Above the default that a 64-token context gives (1 MiB): the bombs and the 8 MB prompt
        # below test what happens when a deployment allows bodies that large.
        max_body_bytes=9 * 1024 * 1024,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def http(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client:
        yield client


def send(http: httpx.Client, bad: Bad, path: str, stream: bool, key: str = KEY) -> httpx.Response:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}", **bad.headers}
    return http.post(path, content=bad.content(path, stream), headers=headers)


def assert_openai_error(response: httpx.Response, bad: Bad) -> None:
    assert response.status_code == bad.status, response.text
    assert response.headers["content-type"] == "application/json"  # never text/event-stream
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert bad.message in error["message"]
    assert error["param"] == bad.param
    assert error["type"] == bad.error_type
    assert error["code"] == bad.code


@pytest.mark.parametrize(("bad", "path", "stream"), list(runs()))
def test_bad_request_gets_an_openai_error_and_never_reaches_the_model(
    live: LiveServer, http: httpx.Client, bad: Bad, path: str, stream: bool
) -> None:
    live.wait_idle()
    num_steps = live.engine.core.num_steps
    assert_openai_error(send(http, bad, path, stream), bad)
    assert live.engine.core.num_steps == num_steps


def test_bad_requests_cost_no_tokens(live: LiveServer, http: httpx.Client) -> None:
    """The tokens bucket is charged only once a request is valid; every 400 shows it still full."""
    for bad in CATALOGUE:
        for path in bad.endpoints:
            response = send(http, bad, path, stream=False, key=METER_KEY)
            assert response.status_code == bad.status
            if bad.status == 400 and "idempotency" not in (bad.code or ""):
                assert response.headers["x-ratelimit-limit-tokens"] == str(TPM)
                assert response.headers["x-ratelimit-remaining-tokens"] == str(TPM), bad.name
    good = http.post(CHAT, json=BASE[CHAT], headers={"Authorization": f"Bearer {METER_KEY}"})
    assert good.status_code == 200
    assert int(good.headers["x-ratelimit-remaining-tokens"]) < TPM  # the control: a good one is charged


def test_a_left_out_max_tokens_is_lowered_to_the_request_budget(http: httpx.Client) -> None:
    """OpenAI's default max_tokens is the rest of the context; past the budget it is lowered to fit
    (2000 // (16 choices x 21) = 5 tokens each), and the request runs rather than failing for a
    number its client never sent. (The work budget's arithmetic: tests/app/runtime/test_request_budget.py;
    this module's TPM limit is below it.)"""
    chat = {**BASE[CHAT], "n": 16, "logprobs": True, "top_logprobs": 20, "ignore_eos": True}
    del chat["max_tokens"]
    response = http.post(CHAT, json=chat)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["completion_tokens"] == 16 * (OUTPUT_BUDGET // (16 * 21))
    assert {choice["finish_reason"] for choice in body["choices"]} == {"length"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", BOTH)
def test_control_characters_in_content_are_accepted(http: httpx.Client, path: str, stream: bool) -> None:
    text = "tab\there, nul\x00, bell\x07, escape\x1b[0m, delete\x7f"
    body = {**BASE[path], "stream": stream}
    body.update({"messages": [{"role": "user", "content": text}]} if path == CHAT else {"prompt": text})
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text


def test_a_surrogate_pair_is_one_character_and_accepted(http: httpx.Client) -> None:
    body = json.dumps(BASE[CHAT])[:-1].replace('"Hi"', '"smile \\ud83d\\ude00"') + "}"
    response = http.post(CHAT, content=body.encode(), headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text


# -- regression tests, named after the defect


def test_lone_surrogate_in_content_is_a_400_not_a_500(http: httpx.Client) -> None:
    for path, raw in (
        (CHAT, '"messages": [{"role": "user", "content": "\\ud800"}]'),
        (COMPLETIONS, '"prompt": "\\ud800"'),
    ):
        body = json.dumps({"model": MODEL_NAME})[:-1] + ", " + raw + "}"
        response = http.post(path, content=body.encode(), headers={"Content-Type": "application/json"})
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_logit_bias_key_with_a_unicode_digit_is_a_400_not_a_500(http: httpx.Client) -> None:
    for key in ("²", "١", "9" * 5000):  # isdigit() is true for all; int() refuses the first and the last
        response = http.post(CHAT, json={**BASE[CHAT], "logit_bias": {key: 1}})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "logit_bias"


def test_nan_temperature_is_refused_as_not_finite(http: httpx.Client) -> None:
    body = json.dumps(BASE[COMPLETIONS])[:-1] + ', "temperature": NaN}'
    response = http.post(COMPLETIONS, content=body.encode(), headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "Invalid value for 'temperature': Input should be a finite number",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": None,
    }


@pytest.mark.parametrize("path", BOTH)
def test_an_8_mb_prompt_is_refused_without_tokenizing_all_of_it(
    live: LiveServer, http: httpx.Client, path: str
) -> None:
    """Tokenizing 8 MB took about 11 s of the event loop, stalling every other request."""
    text = "hello world " * 650_000
    body = {**BASE[path], "max_tokens": 1}
    body.update({"messages": [{"role": "user", "content": text}]} if path == CHAT else {"prompt": [text]})
    response = http.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "at least" in error["message"]  # measured on a prefix, not the whole text


def test_ten_thousand_short_texts_are_measured_before_any_render(
    live: LiveServer, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: texts under the early check's size each slipped past it, so 4,000 short
    messages were rendered and tokenized whole (on the event loop) only to be refused."""
    rendered: list[int] = []
    real = live.engine.tokenizer.encode_chat
    monkeypatch.setattr(live.engine.tokenizer, "encode_chat", lambda *a, **k: rendered.append(1) or real(*a, **k))
    body = {**BASE[CHAT], "messages": [{"role": "user", "content": "x" * 48}] * 4000}
    response = http.post(CHAT, json=body)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert "at least" in response.json()["error"]["message"] and not rendered


@pytest.mark.parametrize("path", BOTH)
def test_a_large_body_is_tokenized_off_the_event_loop(
    live: LiveServer, http: httpx.Client, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The attack: megabytes of prompt rendered and tokenized on the event loop, while /health and
    /ready waited (the kubelet restarts the pod). A large body's prompts are encoded on a worker
    thread; a small one's in line (a thread hop would cost it more than it saves)."""
    on_loop: list[bool] = []

    def watched(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                on_loop.append(True)
            except RuntimeError:
                on_loop.append(False)
            return method(*args, **kwargs)

        return call

    tokenizer = live.engine.tokenizer
    monkeypatch.setattr(tokenizer, "encode_chat", watched(tokenizer.encode_chat))
    monkeypatch.setattr(tokenizer, "encode", watched(tokenizer.encode))
    assert http.post(path, json=BASE[path]).status_code == 200
    assert on_loop and all(on_loop)
    on_loop.clear()
    large = {"type": "function", "function": {"name": "f", "description": "d" * 70_000}}
    body = {**BASE[path], "tools": [large]} if path == CHAT else {**BASE[path], "prompt": "word " * 20_000}
    response = http.post(path, json=body)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert on_loop and not any(on_loop)


def test_non_ascii_idempotency_key_is_a_400(http: httpx.Client) -> None:
    headers = {b"Idempotency-Key": b"caf\xe9"}
    response = http.post(CHAT, json=BASE[CHAT], headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_idempotency_key"


@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_prompt_in_a_list_is_a_400_not_a_500(live: LiveServer, http: httpx.Client, stream: bool) -> None:
    """Only the longest prompt was checked for emptiness; the engine then failed the empty one."""
    live.wait_idle()
    num_steps = live.engine.core.num_steps
    response = http.post(COMPLETIONS, json={**BASE[COMPLETIONS], "prompt": ["Hi", "", "there"], "stream": stream})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == "Prompt 1 is empty."
    assert live.engine.core.num_steps == num_steps


def test_stop_token_id_out_of_vocabulary_names_stop_token_ids_not_logit_bias(http: httpx.Client) -> None:
    response = http.post(CHAT, json={**BASE[CHAT], "stop_token_ids": [10**9]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stop_token_ids"
