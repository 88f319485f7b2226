"""The wheel a plain `pip install .` builds (the Docker image's install) carries every package, and
the C source of the int8 block kernel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("app", "models", "middleware")


def test_the_wheel_carries_every_subpackage(tmp_path: Path) -> None:
    # Built from a copy of what the Dockerfile copies: a build/ left in the checkout would lend
    # the wheel files that the package list does not name.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for top in PACKAGES:
        shutil.copytree(ROOT / top, source / top, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    subprocess.run([*command, str(source)], check=True, timeout=120)
    (wheel,) = wheels.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = [init.relative_to(ROOT).as_posix() for top in PACKAGES for init in (ROOT / top).rglob("__init__.py")]
    assert "app/server/__init__.py" in packages  # the check covers subpackages
    assert [p for p in packages if p not in names] == []
    # Not a package: the int8 block kernel's C source, which models/linear/block_kernel.py compiles.
    assert "models/linear/kernels/q8_blocks.c" in names
