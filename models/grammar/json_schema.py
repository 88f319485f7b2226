"""A client's JSON Schema before the grammar library sees it: bounded, and its objects closed.

`check_bounds` walks a schema in Python, without recursion, and refuses one that the grammar
library could not compile safely or enforce: llguidance compiles `$ref` chains recursively on the
native stack, and a chain of 1,000 definitions (a 94 KB schema) overflowed it and killed the whole
process with SIGSEGV; compile time grows faster than linearly with the properties of one object
(16,000 took 7 s and then panicked); and an object with ~500 optional properties compiles but its
first mask overflows the matcher's row bound (2,000 Earley items, 4 an optional property)
mid-generation. Every bound is far above what real clients send (OpenAI's structured outputs allow
5,000 properties and 10 levels of object nesting) and is named in the refusal.

`close_objects` gives every object that declares `properties` and says nothing of extra ones
`additionalProperties: false`, as OpenAI's strict mode and vLLM's default grammar backend do:
JSON Schema's own default lets the grammar invent keys, and a model that starts one may never end
it (a random model ran into one long invented key until `max_tokens` in 7 of 12 seeds).

No llguidance here: pure data, so it is tested and reasoned about on its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

# Keywords whose value is one subschema, a list of them, or a map of them.
_ONE: tuple[str, ...] = ("additionalProperties", "items", "additionalItems", "contains", "not", "if", "then")
_ONE += ("else", "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# Alternatives that stand at the same place of the document: their open choices add up.
_ALTERNATIVES = ("anyOf", "oneOf", "allOf")


@dataclass(frozen=True, slots=True)
class SchemaBounds:
    max_bytes: int = 512 * 1024  # the schema as compact JSON
    max_nodes: int = 10_000  # subschemas reachable from the root
    # Subschemas on the longest path from the root, inline or through $ref (cycles cut): the
    # compiler recursed ~1,400 deep before it overflowed an 8 MiB stack; 128 leaves a margin for
    # smaller thread stacks and is ~30 levels of pydantic models (property, anyOf, array, $ref).
    max_depth: int = 128
    max_properties: int = 5_000  # over the whole schema (OpenAI's limit)
    # Optional properties that may come next at one place (one object's, or the sum over the
    # alternatives of an anyOf): the matcher's row bound is reached near 500.
    max_open_properties: int = 400


DEFAULT_BOUNDS = SchemaBounds()


class SchemaTooComplex(ValueError):
    """A schema past one of the bounds; the message names the bound and is safe for clients."""


def check_bounds(schema: Any, bounds: SchemaBounds | None = None) -> None:
    """Raise SchemaTooComplex if `schema` is past a bound (DEFAULT_BOUNDS unless given); the walk
    is linear in its size."""
    bounds = bounds or DEFAULT_BOUNDS
    _Walk(schema, bounds).run()
    try:
        size = len(json.dumps(schema, separators=(",", ":")))
    except RecursionError:  # a value (`const`, `default`) nested deeper than the walk looks
        raise SchemaTooComplex("the schema nests too deeply") from None
    if size > bounds.max_bytes:
        raise SchemaTooComplex(f"the schema is {size:,} bytes; at most {bounds.max_bytes:,} are supported")


class _Walk:
    """One post-order pass over the schema graph ($ref edges included), each node once."""

    def __init__(self, root: Any, bounds: SchemaBounds) -> None:
        self.root = root
        self.bounds = bounds
        self.depth: dict[int, int] = {}  # id(node) -> subschemas on its longest path down
        self.open: dict[int, int] = {}  # id(node) -> optional properties that may come next there
        self.num_properties = 0

    def run(self) -> None:
        bounds = self.bounds
        on_path: set[int] = set()
        # (node, its children, how many are done); a child on the path is a cycle: it adds nothing.
        stack: list[tuple[Any, list[Any], list[int]]] = [(self.root, self._children(self.root), [0])]
        on_path.add(id(self.root))
        while stack:
            node, children, done = stack[-1]
            if done[0] < len(children):
                child = children[done[0]]
                done[0] += 1
                key = id(child)
                if key in self.depth or key in on_path:
                    continue
                if len(on_path) >= bounds.max_depth:
                    raise SchemaTooComplex(
                        f"the schema nests deeper than {bounds.max_depth} levels (inline or through $ref)"
                    )
                if len(self.depth) + len(on_path) >= bounds.max_nodes:
                    raise SchemaTooComplex(f"the schema has more than {bounds.max_nodes:,} subschemas")
                on_path.add(key)
                stack.append((child, self._children(child), [0]))
                continue
            stack.pop()
            on_path.discard(id(node))
            self._finish(node, children)

    def _finish(self, node: Any, children: list[Any]) -> None:
        """Record a node whose children are all done."""
        bounds = self.bounds
        depth = self.depth
        depth[id(node)] = 1 + max((depth.get(id(child), 0) for child in children), default=0)
        if not isinstance(node, Mapping):
            return
        num_open = 0
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            self.num_properties += len(properties)
            if self.num_properties > bounds.max_properties:
                raise SchemaTooComplex(f"the schema has more than {bounds.max_properties:,} properties")
            required = node.get("required")
            num_open = len(properties)
            if isinstance(required, list):
                num_open -= sum(1 for name in set(required) if isinstance(name, str) and name in properties)
        alternatives = [a for k in _ALTERNATIVES if isinstance(node.get(k), list) for a in node[k]]
        if "$ref" in node:
            target = resolve_ref(self.root, node)
            if target is not None:
                alternatives.append(target)
        if alternatives:
            num_open += sum(self.open.get(id(alternative), 0) for alternative in alternatives)
        if num_open > bounds.max_open_properties:
            raise SchemaTooComplex(
                f"one object of the schema has {num_open:,} optional properties to choose from at once; "
                f"at most {bounds.max_open_properties} are supported (make some required, or split the object)"
            )
        if num_open:
            self.open[id(node)] = num_open

    def _children(self, node: Any) -> list[Any]:
        if not isinstance(node, Mapping):
            return []
        out = list(_subschemas(node))
        if "$ref" in node:
            target = resolve_ref(self.root, node)
            if target is not None:
                out.append(target)
        return out


def resolve_ref(root: Any, node: Any) -> Any | None:
    """What a local `$ref` of `node` points to in `root`; None for none, or for one the library
    will report (remote, dangling)."""
    if not isinstance(node, Mapping):
        return None
    ref = node.get("$ref")
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    target = root
    for part in ref[2:].split("/") if len(ref) > 1 else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(target, Mapping) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target if isinstance(target, Mapping | bool) else None


def _subschemas(node: Mapping[str, Any]) -> Iterator[Any]:
    """The subschemas written inside `node` (not those its $ref points to)."""
    for key in _ONE:
        value = node.get(key)
        if isinstance(value, Mapping | bool):
            yield value
        elif key == "items" and isinstance(value, list):
            yield from value
    for key in _MANY:
        value = node.get(key)
        if isinstance(value, list):
            yield from (item for item in value if isinstance(item, Mapping | bool))
    for key in _MAP:
        value = node.get(key)
        if isinstance(value, Mapping):
            yield from (item for item in value.values() if isinstance(item, Mapping | bool))


def close_objects(schema: Any) -> Any:
    """A copy of `schema` where every object that declares `properties` and says nothing of
    others (no `additionalProperties`, `patternProperties` or `unevaluatedProperties`) takes
    only those: `additionalProperties: false`. Members of an `allOf` of two or more stay open
    (closing one would forbid the others' properties); objects without `properties` (`{"type":
    "object"}`, JSON mode) stay open. Call after `check_bounds`: the walk is iterative."""
    copy = json.loads(json.dumps(schema))
    if not isinstance(copy, dict):
        return copy
    merged = _allof_members(copy)
    for node in _nodes(copy):
        if id(node) in merged or not isinstance(node.get("properties"), Mapping):
            continue
        if not any(k in node for k in ("additionalProperties", "patternProperties", "unevaluatedProperties")):
            node["additionalProperties"] = False
    return copy


def _nodes(root: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every object subschema written in `root`, itself included (no $ref followed), iteratively."""
    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(_subschemas(node))
            yield node


def _allof_members(root: dict[str, Any]) -> set[int]:
    """ids of the members of every allOf of two or more, and of what members' $refs point to."""
    members: set[int] = set()
    for node in _nodes(root):
        parts = node.get("allOf")
        if isinstance(parts, list) and len(parts) > 1:
            for part in parts:
                members.add(id(part))
                target = resolve_ref(root, part)
                if target is not None:
                    members.add(id(target))
    return members
