"""The Codex CLI (npm `@openai/codex`, examples/codex) against a real surge server: `codex exec`
runs a whole turn over the Responses API (its ~18,600-token request: instructions, tool schemas,
a `namespace` group, `web_search`; `store: false`, `include`, `client_metadata`), and
`codex exec resume` sends the conversation again, whose prefix the cache serves.

Needs `node` and examples/codex/node_modules (`make test` runs `npm install` there when npm
exists); without them the test skips and says which is missing.

The tiny model's random weights rarely write its end-of-turn token, so a reply would run for
thousands of tokens; the model here is the tiny one edited so that each step ends the turn with a
fair chance (a residual dimension held constant feeds only the end token's logit) and never opens
a tool call: a turn of a few tokens, whose text is still the model's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from models.loading import tiny
from tests.examples.conftest import EXAMPLES
from tests.live_server import MODEL_NAME, LiveServer, running_server

CODEX = EXAMPLES / "codex" / "node_modules" / ".bin" / "codex"
# The residual dimension held at RESIDUAL; the end token's logit reads it with END_WEIGHT (about
# a one-in-four chance a step, measured), the tool-call tag's with a large negative weight.
DIMENSION, RESIDUAL, END_WEIGHT = 0, 1.0, 0.75


def ending_model(source: Path, out: Path) -> Path:
    """`source` (a tiny llama) with turns that end within a few tokens."""
    shutil.copytree(source, out)
    weights = load_file(str(out / "model.safetensors"))
    weights["model.embed_tokens.weight"][:, DIMENSION] = RESIDUAL
    for name, tensor in weights.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            tensor[DIMENSION, :] = 0.0  # no layer writes the held dimension
    head = weights["lm_head.weight"]
    head[:, DIMENSION] = 0.0
    head[tiny.IM_END_ID, DIMENSION] = END_WEIGHT
    for tag in (tiny.TOOL_CALL_ID, tiny.THINK_ID):
        head[tag, DIMENSION] = -10 * END_WEIGHT
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def codex_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the Codex CLI cannot run")
    if not CODEX.exists():
        pytest.skip("examples/codex/node_modules is missing: run `npm install` in examples/codex (make test does)")
    root = tmp_path_factory.mktemp("codex-model")
    model = ending_model(tiny.build_tiny("s", root / "tiny"), root / "ending")
    with running_server(model) as live:  # the model's own context: 32,768 tokens
        yield live


def codex(server: LiveServer, home: Path, work: Path, *args: str) -> list[dict[str, Any]]:
    """Run `codex exec ... --json` against `server`; its JSONL events."""
    config = (EXAMPLES / "codex" / "config.toml").read_text()
    config = config.replace('model = "tiny"', f'model = "{MODEL_NAME}"').replace(
        "http://127.0.0.1:8000/v1", f"{server.url}/v1"
    )
    (home / "config.toml").write_text(config)
    env = {**os.environ, "CODEX_HOME": str(home), "NO_COLOR": "1"}
    command = [str(CODEX), "exec", *args, "--json", "--skip-git-repo-check"]
    done = subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_codex_exec_runs_a_turn_and_resumes_it_from_the_prefix_cache(codex_server: LiveServer, tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    first = codex(codex_server, home, work, "Say hello.")
    turn = next(event for event in first if event["type"] == "turn.completed")
    assert turn["usage"]["input_tokens"] > 10_000  # Codex's instructions and tool schemas, all read
    replies = [event["item"] for event in first if event["type"] == "item.completed"]
    assert any(item["type"] == "agent_message" for item in replies), first
    assert not [event for event in first if event["type"] in ("turn.failed", "error")], first

    again = codex(codex_server, home, work, "resume", "--last", "Once more.")
    turn = next(event for event in again if event["type"] == "turn.completed")
    # Codex sends the whole conversation again (store: false): the first turn's tokens are cached.
    assert turn["usage"]["cached_input_tokens"] > 10_000, turn
