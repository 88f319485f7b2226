"""The components of OpenAI's OpenAPI document that surge's responses must validate against.

    python -m scripts.openai_components OPENAPI_JSON [--commit SHA] > tests/openai_components.json

OPENAPI_JSON is `openapi.json` of the openai/openai-openapi repository. The output holds the
named response schemas and every component they reach through `$ref`, nothing else (the whole
document is 3.4 MB), so `make test` validates offline (tests/openai_wire.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "ListModelsResponse",
    "ErrorResponse",
    "Response",
    "ResponseStreamEvent",
)
REF_PREFIX = "#/components/schemas/"


def reachable(schemas: dict[str, Any], roots: tuple[str, ...]) -> dict[str, Any]:
    """`roots` and every schema they reach through `$ref`, by name."""
    found: dict[str, Any] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found[name] = schemas[name]
        pending.extend(_refs(schemas[name]))
    return dict(sorted(found.items()))


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        refs = [node["$ref"][len(REF_PREFIX) :]] if isinstance(node.get("$ref"), str) else []
        return refs + [name for value in node.values() for name in _refs(value)]
    if isinstance(node, list):
        return [name for item in node for name in _refs(item)]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("openapi_json")
    parser.add_argument("--commit", default="", help="the openai-openapi commit the file comes from")
    args = parser.parse_args(argv)
    with open(args.openapi_json) as f:
        document = json.load(f)
    out = {
        "source": f"github.com/openai/openai-openapi openapi.json {args.commit}".strip(),
        "openapi": document["openapi"],
        "components": {"schemas": reachable(document["components"]["schemas"], ROOTS)},
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
