"""docs/architecture.md's list of every module, written from the modules' own first paragraphs.

    python -m scripts.architecture          # rewrites the "## Every module" section in place
    python -m scripts.architecture --check  # exits 1 when the section is not what the code says

Each room's line is its `__init__.py` docstring, each module's its docstring's first paragraph:
a module whose opening says what it owns documents itself here too.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
HEADING = "## Every module\n"
PACKAGES = ("app", "models", "middleware")


def _opening(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def module_list() -> str:
    lines: list[str] = []
    for package in PACKAGES:
        lines.append(f"### {package}/\n")
        top = ROOT / package
        rooms = sorted({path.parent for path in top.rglob("*.py")}, key=lambda room: (room != top, room))
        for room in rooms:
            nested = room != top
            if nested:
                lines.append(f"- `{room.relative_to(ROOT)}/`: {_opening(room / '__init__.py')}")
            for path in sorted(room.glob("*.py")):
                if path.name != "__init__.py":
                    lines.append(f"{'  ' if nested else ''}- `{path.relative_to(ROOT)}`: {_opening(path)}")
        lines.append("")
    return "\n".join(lines)


def page() -> str:
    text = PAGE.read_text()
    return text[: text.index(HEADING) + len(HEADING)] + "\n" + module_list()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if the page is stale")
    args = parser.parse_args(argv)
    fresh = page()
    if args.check:
        stale = fresh != PAGE.read_text()
        if stale:
            print("docs/architecture.md is stale: run python -m scripts.architecture", file=sys.stderr)
        return int(stale)
    PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
