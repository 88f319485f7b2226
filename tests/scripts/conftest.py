"""Fixtures for the scripts' tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """scripts/bench.py, the module `python -m scripts.bench` runs."""
    return importlib.import_module("scripts.bench")
