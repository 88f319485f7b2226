"""The schema walk that guards the grammar library, and the closing of objects: pure data, no
library. What the library itself does with schemas at and past the bounds is in test_grammar.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from models.grammar.json_schema import SchemaBounds, SchemaTooComplex, check_bounds, close_objects


def ref_chain(n: int) -> dict[str, Any]:
    """The attack: n definitions, each an object whose one property is the next definition."""
    defs: dict[str, Any] = {
        f"d{i}": {"type": "object", "properties": {"next": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["next"]}
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def optional(n: int, prefix: str = "p") -> dict[str, Any]:
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "integer"} for i in range(n)}}


def test_a_thousand_ref_chain_is_refused_for_its_depth() -> None:
    with pytest.raises(SchemaTooComplex, match="deeper than 128 levels"):
        check_bounds(ref_chain(1000))
    check_bounds(ref_chain(60))  # 121 subschemas deep: within


def test_recursive_schemas_are_not_deep() -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}, "v": {"type": "integer"}},
            }
        },
        "$ref": "#/$defs/node",
    }
    check_bounds(tree)
    check_bounds({"type": "object", "properties": {"a": {"$ref": "#"}}})


def test_inline_nesting_counts_like_refs() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(130):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(SchemaTooComplex, match="deeper"):
        check_bounds(schema)


@pytest.mark.parametrize(
    ("schema", "bound"),
    [
        (optional(401), "401 optional properties"),
        ({"anyOf": [optional(300, "a"), optional(300, "b")]}, "600 optional properties"),
        ({"type": "array", "items": {"$ref": "#/$defs/o"}, "$defs": {"o": optional(450)}}, "450 optional"),
        (optional(16_000), "10,000 subschemas"),
    ],
)
def test_choices_that_would_overflow_the_matcher_are_refused(schema: dict[str, Any], bound: str) -> None:
    with pytest.raises(SchemaTooComplex, match=bound):
        check_bounds(schema)


def test_required_properties_are_not_open_choices() -> None:
    many = optional(3000)
    many["required"] = list(many["properties"])
    check_bounds(many)
    half = optional(600)
    half["required"] = [f"p{i}" for i in range(300)]
    check_bounds(half)


def test_properties_and_bytes_are_bounded_over_the_whole_schema() -> None:
    spread = {"type": "object", "properties": {f"o{j}": optional(100) for j in range(60)}}
    with pytest.raises(SchemaTooComplex, match="more than 5,000 properties"):
        check_bounds(spread)
    with pytest.raises(SchemaTooComplex, match="bytes"):
        check_bounds({"type": "string", "enum": ["x" * 1000] * 600})
    with pytest.raises(SchemaTooComplex, match="subschemas"):
        check_bounds(optional(50), SchemaBounds(max_nodes=20))


def test_a_deep_value_is_refused_not_a_recursion_error() -> None:
    value: Any = 1
    for _ in range(5000):
        value = [value]
    with pytest.raises(SchemaTooComplex, match="too deeply"):
        check_bounds({"const": value})


def test_close_objects_closes_declared_objects_only() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "free": {"type": "object"},
            "open": {"type": "object", "properties": {"x": {}}, "additionalProperties": True},
            "merged": {"allOf": [{"$ref": "#/$defs/X"}, {"properties": {"y": {}}}]},
        },
        "$defs": {"X": {"properties": {"x": {}}}, "Y": {"type": "object", "properties": {"z": {}}}},
    }
    before = json.dumps(schema)
    closed = close_objects(schema)
    assert json.dumps(schema) == before  # a copy
    props = closed["properties"]
    assert closed["additionalProperties"] is False
    assert props["a"]["additionalProperties"] is False
    assert "additionalProperties" not in props["free"]  # JSON mode's {"type": "object"} stays free
    assert props["open"]["additionalProperties"] is True
    # allOf members (and what they point to) stay open: closing one would forbid the others' keys
    assert "additionalProperties" not in closed["$defs"]["X"]
    assert all("additionalProperties" not in part for part in props["merged"]["allOf"])
    assert closed["$defs"]["Y"]["additionalProperties"] is False
