"""scripts/openai_components.py keeps the roots and what they reach, nothing else; and the copy
in tests/ is what it makes of OpenAI's document (its roots are all there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import openai_components


def test_only_what_the_roots_reach_is_kept() -> None:
    schemas = {
        "A": {"properties": {"b": {"$ref": "#/components/schemas/B"}}},
        "B": {"items": [{"$ref": "#/components/schemas/C"}]},
        "C": {"anyOf": [{"$ref": "#/components/schemas/A"}]},  # a cycle ends
        "D": {"type": "string"},
    }
    assert list(openai_components.reachable(schemas, ("A",))) == ["A", "B", "C"]


def test_the_output_is_a_components_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    roots = {name: {"type": "object"} for name in openai_components.ROOTS}
    document = {"openapi": "3.1.0", "components": {"schemas": {**roots, "Unused": {}}}}
    (tmp_path / "openapi.json").write_text(json.dumps(document))
    assert openai_components.main([str(tmp_path / "openapi.json"), "--commit", "abc"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"].endswith("abc") and set(out["components"]["schemas"]) == set(openai_components.ROOTS)


def test_the_copy_in_tests_has_every_root() -> None:
    copy = json.loads((Path(__file__).parents[1] / "openai_components.json").read_text())
    assert set(openai_components.ROOTS) <= set(copy["components"]["schemas"])
