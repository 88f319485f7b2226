"""Schemas sent as a hostile tenant would, through real servers: none crashes a process, each
is a 400 in OpenAI's shape before any stream opens, a schema that fails mid-generation is the
client's 400 and no server error, and one key's compiles are never another's cache hits.

The crash cases run against `surge serve` (engine in its own process), so a native crash shows
as a dead server, not a dead test run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import models.grammar.json_schema
from models.grammar.compiler import TOO_COMPLEX, json_schema_grammar
from models.grammar.json_schema import SchemaBounds
from scripts.harness.procs import spawned_children
from scripts.harness.servers import ServerProcess, surge_server
from tests.app.ops.test_metrics import Scrape
from tests.live_server import MODEL_NAME, LiveServer, running_server
from tests.models.grammar.test_json_schema import optional, ref_chain

USER = [{"role": "user", "content": "Give me the document."}]
# A template that shows the model no tools, as many do: a tool's schema then reaches the grammar
# however large it is (the tiny model's own template renders it, and its context refuses it first).
NO_TOOLS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "doc", "schema": schema}}


def bodies(schema: dict[str, Any], model: str) -> dict[str, tuple[str, dict[str, Any], str]]:
    """The three ways a schema reaches the grammar: (path, body, the 400's param)."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": schema}}
    return {
        "chat": (
            "/v1/chat/completions",
            {"model": model, "messages": USER, "response_format": response_format(schema)},
            "response_format",
        ),
        "completions": (
            "/v1/completions",
            {"model": model, "prompt": "x", "response_format": response_format(schema)},
            "response_format",
        ),
        "tools": (
            "/v1/chat/completions",
            {"model": model, "messages": USER, "tools": [tool], "tool_choice": "required"},
            "tools",
        ),
    }


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("hostile")
    template = directory / "template.jinja"
    template.write_text(NO_TOOLS_TEMPLATE)
    args = ("--served-model-name", "m", "--max-model-len", "512", "--max-num-seqs", "4", "--log-level", "warning")
    args += ("--chat-template", str(template))
    log = directory / "surge.log"
    with surge_server(tiny_model_dir, log, *args) as process:
        yield process


def assert_healthy(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    body = {"model": "m", "messages": USER, "max_tokens": 4}
    assert httpx.post(f"{server.api}/chat/completions", json=body, timeout=60).status_code == 200


@pytest.mark.parametrize("route", ["chat", "completions", "tools"])
def test_a_thousand_ref_chain_is_a_400_and_the_server_stays_healthy(server: ServerProcess, route: str) -> None:
    """The attack: 1,000 definitions, each pointing at the next (94 KB): the grammar library
    compiled it recursively and the HTTP process died of SIGSEGV."""
    path, body, param = bodies(ref_chain(1000), "m")[route]
    response = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "deeper than 128 levels" in error["message"]
    assert_healthy(server)


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (optional(3000), "3,000 optional properties"),  # compiled, then overflowed the matcher mid-generation
        (optional(16_000), "more than 10,000 subschemas"),  # the library panicked, backtrace and all
    ],
    ids=["3000-optional-properties", "16000-optional-properties"],
)
def test_schemas_the_matcher_cannot_enforce_are_refused_at_check_time(
    server: ServerProcess, schema: dict[str, Any], says: str
) -> None:
    for path, body, _ in bodies(schema, "m").values():
        response = httpx.post(f"{server.url}{path}", json=body, timeout=60)
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert says in message
        assert not any(word in message for word in ("panic", "backtrace", ".rs", "/root", ".cargo"))
    assert_healthy(server)


def test_a_native_crash_in_either_process_leaves_a_trace_in_the_log(tiny_model_dir: Path, tmp_path: Path) -> None:
    """faulthandler is on in the server and in the engine's process: a segfault (what the ref
    chain caused) says where each thread was, where before the log had no line about it."""
    for victim in ("engine", "server"):
        log = tmp_path / f"{victim}.log"
        with surge_server(tiny_model_dir, log, "--max-model-len", "256", "--log-level", "warning") as process:
            children = spawned_children(process.pid)
            assert children, "the engine runs in its own process"
            os.kill(children[0] if victim == "engine" else process.pid, signal.SIGSEGV)
            deadline = time.monotonic() + 30
            while "Fatal Python error: Segmentation fault" not in process.log():
                assert time.monotonic() < deadline, process.tail()
                time.sleep(0.1)
        assert "Current thread" in log.read_text() or "Thread 0x" in log.read_text()


@pytest.fixture
def permissive_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lets a schema past the check, as the review found ones that pass it and still fail."""
    monkeypatch.setattr(models.grammar.json_schema, "DEFAULT_BOUNDS", SchemaBounds(max_open_properties=100_000))


def test_a_grammar_failure_mid_generation_is_a_400_not_a_server_error(
    tiny_model_dir: Path, permissive_bounds: None
) -> None:
    """600 optional properties compile, and the first mask after `{` overflows the matcher: with
    n = 16, twice, that was 32 server errors, an error rate of 1.0 and canned replies for every
    tenant. Now the client gets a 400 (an error event once a stream is open), and nothing
    counts as a server error: not after 23 such requests either (the error rate counts from 20)."""
    body = {"model": MODEL_NAME, "messages": USER, "response_format": response_format(optional(600)), "n": 16}
    with running_server(tiny_model_dir, max_model_len=512, max_num_seqs=16) as live:
        for n in (16, 16, *[1] * 20):
            body["n"] = n
            response = httpx.post(f"{live.url}/v1/chat/completions", json=body | {"max_tokens": 8}, timeout=60)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and TOO_COMPLEX in error["message"]
        stream_body = body | {"n": 1, "max_tokens": 8, "stream": True}
        with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=stream_body, timeout=60) as stream:
            events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["type"] == "invalid_request_error"
        live.wait_idle()
        assert live.engine.load_snapshot().error_rate == 0.0
        assert live.state.admission is not None and max(live.state.admission.levels.levels().values(), default=0) == 0
        scrape = Scrape(live)
        assert scrape.value("surge_requests_finished_total", finish_reason="invalid") == 2 * 16 + 20 + 1
        assert scrape.value("surge_requests_finished_total", finish_reason="error") == 0


@pytest.fixture(scope="module")
def keyed(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=512, max_num_seqs=4, api_key=("key-a", "key-b")) as live:
        yield live


def test_one_key_never_gets_a_grammar_another_key_compiled(keyed: LiveServer) -> None:
    """A key learned that another key used schema S: 0.05 s instead of 1 s, and the compile count
    did not move. Compiled grammars are kept per key."""
    schema = {"type": "object", "properties": {"secret_field_s": {"type": "integer"}}, "required": ["secret_field_s"]}
    grammar = json_schema_grammar(schema, closed=True)
    compiler = keyed.engine.grammars
    body = {"model": MODEL_NAME, "messages": USER, "response_format": response_format(schema), "max_tokens": 2}

    def send(key: str) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        response = httpx.post(f"{keyed.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert response.status_code == 200, response.text

    send("key-a")
    assert compiler.is_compiled(grammar, "key:key-a") and not compiler.is_compiled(grammar, "key:key-b")
    send("key-b")
    assert compiler.is_compiled(grammar, "key:key-b")


def test_tool_arguments_never_carry_keys_the_tool_does_not_declare(keyed: LiveServer) -> None:
    """LangChain's `bind_tools` sends parameters without `additionalProperties`; the grammar let
    the random model invent keys (and run into one until max_tokens: invalid JSON in 7 of 12
    seeds). Objects that declare properties are closed by default, as in OpenAI's strict mode."""
    parameters = {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["unit"],
    }
    tool = {"type": "function", "function": {"name": "forecast", "parameters": parameters}}
    headers = {"Authorization": "Bearer key-a"}
    for seed in range(12):
        body = {
            "model": MODEL_NAME,
            "messages": USER,
            "tools": [tool],
            "tool_choice": "required",
            "max_tokens": 60,
            "temperature": 1.0,
            "seed": seed,
            "parallel_tool_calls": False,
        }
        response = httpx.post(f"{keyed.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        (call,) = response.json()["choices"][0]["message"]["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        assert set(arguments) <= {"unit", "days"} and "unit" in arguments, arguments
