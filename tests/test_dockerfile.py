"""The Dockerfile, checked without a Docker engine: parsed by a small parser and held to our rules.

What this cannot check: that the image builds, that pip resolves, that the container starts.
No Docker engine runs where the tests run (docs/operations.md says so).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY...
    value: str  # the rest of the logical line, continuations joined


def parse_dockerfile(text: str) -> list[Instruction]:
    """Logical instructions: comments dropped, backslash continuations joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # a comment inside a continuation is dropped too, as Docker does
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        keyword, _, value = pending.partition(" ")
        instructions.append(Instruction(keyword.upper(), value.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continuation"
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """Instructions per build stage (each starting at its FROM); global ARGs are left out."""
    result: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(p, str) for p in parsed)
    return parsed


def copy_sources(instruction: Instruction) -> list[str]:
    """Local sources of a COPY or ADD (none for `--from=`, which copies from another stage)."""
    words = exec_form(instruction.value) if instruction.value.startswith("[") else shlex.split(instruction.value)
    flags = [w for w in words if w.startswith("--")]
    if any(f.startswith("--from=") for f in flags):
        return []
    paths = [w for w in words if not w.startswith("--")]
    return paths[:-1]


def is_ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics for the common cases: the last matching pattern wins, `!` re-includes,
    a pattern matching a parent directory excludes what is inside it."""
    parts = Path(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        regex = _glob_regex(pattern)
        if any(regex.fullmatch(candidate) for candidate in candidates):
            ignored = not negate
    return ignored


def _glob_regex(pattern: str) -> re.Pattern[str]:
    pieces = [
        ".*" if piece == "**" else fnmatch.translate(piece).removesuffix(r"\Z").removeprefix("(?s:").removesuffix(")")
        for piece in pattern.split("/")
    ]
    return re.compile("/".join(pieces).replace(".*/", "(?:.*/)?"))


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


INSTRUCTIONS = parse_dockerfile((ROOT / "Dockerfile").read_text())
STAGES = stages(INSTRUCTIONS)
FINAL = STAGES[-1]


def last(keyword: str, stage: list[Instruction] = FINAL) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert found, f"no {keyword} in the final stage"
    return found[-1]


def test_is_multi_stage_from_a_base_image_argument() -> None:
    assert len(STAGES) >= 2
    global_args = [i.value for i in INSTRUCTIONS[: INSTRUCTIONS.index(STAGES[0][0])] if i.keyword == "ARG"]
    assert any(arg.startswith("BASE_IMAGE=python:3.11-slim") for arg in global_args)
    assert all(stage[0].value.startswith("${BASE_IMAGE}") for stage in STAGES)
    builder = STAGES[0][0].value.split()[-1]
    assert any(i.keyword == "COPY" and f"--from={builder}" in i.value for i in FINAL)


def test_torch_is_pinned_and_comes_from_the_cpu_index_by_default() -> None:
    args = [i.value for i in STAGES[0] if i.keyword == "ARG"]
    assert "TORCH_SPEC=torch==2.13.0" in args
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in args


def test_the_final_stage_runs_as_a_non_root_user() -> None:
    user = last("USER").value.split(":")[0]
    assert user not in ("root", "0")


def test_healthcheck_hits_health_without_curl() -> None:
    healthcheck = last("HEALTHCHECK").value
    assert "/health" in healthcheck
    assert "urllib" in healthcheck
    assert "curl" not in healthcheck


def test_listens_on_all_interfaces_on_8000_and_takes_the_model_from_the_environment() -> None:
    assert last("EXPOSE").value.split() == ["8000"]
    env = " ".join(i.value for i in FINAL if i.keyword == "ENV")
    assert "SURGE_HOST=0.0.0.0" in env
    assert "SURGE_MODEL=tiny" in env


def test_the_entrypoint_runs_surge_serve() -> None:
    assert exec_form(last("ENTRYPOINT").value) == ["surge", "serve"]


def test_every_copied_path_exists_and_is_not_dockerignored() -> None:
    patterns = dockerignore()
    sources = [s for i in INSTRUCTIONS if i.keyword in ("COPY", "ADD") for s in copy_sources(i)]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not is_ignored(source, patterns), source


def test_dockerignore_keeps_the_heavy_and_private_things_out() -> None:
    patterns = dockerignore()
    for path in (".venv", ".cache", "bench-results", ".pytest_cache", ".git", "app/__pycache__"):
        assert is_ignored(path, patterns), path
    assert not is_ignored("app/server/factory.py", patterns)


def test_the_parser_joins_continuations_and_drops_comments() -> None:
    parsed = parse_dockerfile("# c\nFROM a AS b\nRUN one \\\n  # inner comment\n  two\n")
    assert parsed == [Instruction("FROM", "a AS b"), Instruction("RUN", "one two")]
