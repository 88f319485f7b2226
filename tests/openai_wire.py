"""Validation of surge's bodies against OpenAI's own response schemas (tests/openai_components.json,
cut from the openai/openai-openapi repository's openapi.json by scripts/openai_components.py).

    assert_openai(body, "CreateChatCompletionResponse")

The document still writes OpenAPI 3.0's `nullable: true` in places; it is read as "or null".
Every other keyword is JSON Schema 2020-12, which OpenAPI 3.1 uses.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

COMPONENTS = Path(__file__).with_name("openai_components.json")


def _or_null(node: Any) -> Any:
    """A copy of a schema tree with `nullable: true` turned into `anyOf [..., null]`."""
    if isinstance(node, list):
        return [_or_null(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _or_null(value) for key, value in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


@functools.cache
def _document() -> dict[str, Any]:
    return dict(_or_null(json.loads(COMPONENTS.read_text())))


@functools.cache
def _validator(component: str) -> jsonschema.Draft202012Validator:
    document = copy.deepcopy(_document())
    if component not in document["components"]["schemas"]:
        raise KeyError(f"{component} is not in {COMPONENTS.name}; add it to scripts/openai_components.py")
    schema = {"$ref": f"#/components/schemas/{component}", "components": document["components"]}
    return jsonschema.Draft202012Validator(schema)


def openai_errors(body: Any, component: str) -> list[str]:
    """What in `body` breaks OpenAI's `component` schema, one line per error; empty when valid."""
    return [
        f"{'/'.join(str(part) for part in error.absolute_path) or '(body)'}: {error.message}"
        for error in _validator(component).iter_errors(body)
    ]


def assert_openai(body: Any, component: str) -> None:
    errors = openai_errors(body, component)
    assert not errors, f"not a valid {component}:\n" + "\n".join(errors) + f"\n{json.dumps(body)[:2000]}"
