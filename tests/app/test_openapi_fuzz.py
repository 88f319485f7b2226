"""schemathesis against the server's own /openapi.json: no 5xx, every error in its protocol's shape
(Anthropic's on /v1/messages, OpenAI's everywhere else).

One test per operation in the schema (the generation endpoints read their bodies by hand;
`app/runtime/body.py` documents those bodies so schemathesis can build them). The schema is taken from
an app built at import time, since pytest collects the tests before any server runs; the test
checks it is the document the live server serves. NOTE: not `schemathesis.pytest.from_fixture`,
which sets a private pytest attribute (`_nodeid`) that pytest 9 no longer has. Examples are both
positive (fit the schema) and negative (break it), bounded per operation so the module runs in
well under a minute on two cores. Generations stay short: the context is MAX_MODEL_LEN tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.config import HealthCheck

from app.config.settings import Settings
from app.server.factory import create_app
from tests.live_server import MODEL_NAME, LiveServer, running_server

MAX_EXAMPLES = 30  # per operation and generation mode
MAX_MODEL_LEN = 48
TIMEOUT_S = 30

OPENAPI = create_app(Settings(model="echo", served_model_name=MODEL_NAME)).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI)
schema.config.generation.update(
    max_examples=MAX_EXAMPLES,
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    database="none",  # no saved failing examples: every run starts afresh
)
# A busy two-core machine (the engine steps between examples) must not fail the run as "too slow".
schema.config.suppress_health_check = [HealthCheck.too_slow]


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=MAX_MODEL_LEN, max_num_seqs=4, dedup_ttl_seconds=0) as server:
        yield server


@pytest.fixture(scope="module")
def examples_sent() -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    yield counts
    documented = {f"{method.upper()} {path}" for path, item in OPENAPI["paths"].items() for method in item}
    per_operation = {name: count for name, count in counts.items() if name in documented}
    num_other = sum(counts.values()) - sum(per_operation.values())
    print(f"\nschemathesis: {per_operation}; {num_other} more with undocumented methods (405)")


def test_the_schema_is_the_served_one_and_documents_the_request_bodies(live: LiveServer) -> None:
    assert httpx.get(f"{live.url}/openapi.json").json() == OPENAPI
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"):
        body = OPENAPI["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        schema_text = str(body["content"]["application/json"]["schema"])
        assert "$ref" not in schema_text
        assert "'model'" in schema_text


@schema.parametrize()
def test_no_server_errors_and_every_error_is_in_its_protocols_shape(
    case: Any, live: LiveServer, examples_sent: Counter[str]
) -> None:
    # Most schema-valid model names are unknown (a 404 at the first check); the served one makes
    # the rest of the body matter. Unknown models are in tests/app/test_bad_input.py.
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL_NAME
    response = case.call(base_url=live.url, timeout=TIMEOUT_S)
    examples_sent[f"{case.method} {case.path}"] += 1
    assert response.status_code < 500, response.text
    if response.status_code >= 400 and not (case.path == "/ready" and response.status_code == 503):
        assert _header(response.headers, "content-type") == "application/json"
        body = response.json()
        if case.path.startswith("/v1/messages"):
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        else:
            assert set(body) == {"error"}, body
            assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def _header(headers: Any, name: str) -> str:
    value = headers[name]
    return str(value[0] if isinstance(value, list) else value)  # schemathesis keeps every value
