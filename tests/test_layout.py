"""The layout's rules (docs/architecture.md): rooms a newcomer can name, arrows that only point
down, the engine behind its face, small files, and a module list that matches the code."""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

import pytest

import models

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "models", "middleware")
MAX_LINES = 400
MAX_MODULES_PER_ROOM = 12


def modules() -> dict[str, Path]:
    """Every module of the three packages by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = modules()


def imports(path: Path) -> set[str]:
    """The project modules `path` imports, anywhere in it (deferred imports are arrows too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from package import module` imports the module.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in MODULES}


GRAPH = {name: imports(path) - {name} for name, path in MODULES.items()}


def room(name: str) -> str:
    """A module's room: the folder right under its package, or the module itself."""
    parts = name.split(".")
    return ".".join(parts[:2])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_is_over_400_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long


def test_no_room_holds_more_than_12_modules() -> None:
    folders: dict[Path, int] = defaultdict(int)
    for path in MODULES.values():
        if path.name != "__init__.py":
            folders[path.parent] += 1
    crowded = {str(folder.relative_to(ROOT)): n for folder, n in folders.items() if n > MAX_MODULES_PER_ROOM}
    assert not crowded


def test_every_room_says_what_it_owns() -> None:
    silent = [
        str(path.relative_to(ROOT))
        for path in MODULES.values()
        if path.name == "__init__.py" and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not silent


def test_the_engine_never_imports_the_server_and_the_layers_never_import_the_app() -> None:
    upward = [
        (name, target)
        for name, targets in GRAPH.items()
        for target in targets
        if (name.startswith("models") and target.split(".")[0] in ("app", "middleware"))
        or (name.startswith("middleware") and target.startswith("app"))
    ]
    assert not upward


def test_the_server_and_the_layers_reach_the_engine_only_through_its_face() -> None:
    behind = sorted(
        (name, target)
        for name, targets in GRAPH.items()
        if not name.startswith("models")
        for target in targets
        if target.startswith("models.")
    )
    assert not behind, "import these from `models` (its face, models/__init__.py)"
    unknown = []
    for name, path in MODULES.items():
        if name.startswith("models"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "models":
                unknown += [(name, alias.name) for alias in node.names if alias.name not in models.FACE]
    assert not unknown


def test_the_engine_does_not_import_its_own_face() -> None:
    assert not [name for name, targets in GRAPH.items() if name.startswith("models.") and "models" in targets]


@pytest.mark.parametrize("name", sorted(models.FACE))
def test_each_name_of_the_face_is_its_modules_own(name: str) -> None:
    module = importlib.import_module(models.FACE[name])
    assert getattr(models, name) is getattr(module, name)


def test_the_faces_type_imports_match_its_names() -> None:
    """What type checkers see (the `TYPE_CHECKING` imports) is what loads at run time."""
    tree = ast.parse((ROOT / "models" / "__init__.py").read_text())
    typed = {
        alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("models.")
        for alias in node.names
    }
    assert typed == models.FACE


def test_no_import_circles_between_modules() -> None:
    assert not circles(GRAPH)


def test_no_import_circles_between_rooms() -> None:
    rooms: dict[str, set[str]] = defaultdict(set)
    for name, targets in GRAPH.items():
        if name in PACKAGES:  # a package's own face stands above its rooms
            continue
        rooms[room(name)].update(room(target) for target in targets if room(target) != room(name))
    assert not circles(rooms)


def test_the_architecture_page_lists_every_module_and_no_other() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\s*- `((?:app|models|middleware)/[\w/]+\.py)`:", text, re.M))
    actual = {str(path.relative_to(ROOT)) for path in MODULES.values() if path.name != "__init__.py"}
    hint = "python -m scripts.architecture rewrites the list"
    assert listed == actual, (sorted(actual - listed), sorted(listed - actual), hint)
