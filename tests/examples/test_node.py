"""examples/node/stream.mjs: the Node openai SDK streaming from surge.

Needs `node` and examples/node/node_modules (`make test` runs `npm install` there when npm exists);
without them the test skips and says which is missing.
"""

from __future__ import annotations

import re
import shutil

import pytest

from tests.examples.conftest import EXAMPLES, run_example
from tests.live_server import LiveServer

NODE_EXAMPLE = EXAMPLES / "node"


def test_node_sdk_streams_a_chat_completion(examples_server: LiveServer) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node example cannot run")
    if not (NODE_EXAMPLE / "node_modules" / "openai").is_dir():
        pytest.skip("examples/node/node_modules is missing: run `npm install` in examples/node (make test does)")
    out = run_example([node, str(NODE_EXAMPLE / "stream.mjs")], examples_server.url).stdout
    finish = re.search(r"^finish_reason: (\w+)$", out, re.MULTILINE)
    usage = re.search(r"usage: \d+ prompt \+ (\d+) completion tokens", out)
    assert finish is not None and usage is not None, out
    # Sampled (the SDK's default temperature): the model may end early with its end token.
    completion = int(usage.group(1))
    assert (finish.group(1), completion) == ("length", 32) or (finish.group(1) == "stop" and 0 < completion < 32), out
    assert int(re.search(r"streamed (\d+) chunks", out).group(1)) > 0  # type: ignore[union-attr]
