"""Fixtures for the engine's tests: one small model of each architecture we serve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from models.tiny import build_tiny

# name -> (arch, build kwargs). A 16-token window with prompts up to 40 tokens exercises the
# sliding mask; Qwen2 with max_window_layers=1 mixes full and sliding layers.
ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen2-mixed-sliding": ("qwen2", {"sliding_window": 16, "max_window_layers": 1}),
    "mistral-sliding": ("mistral", {"sliding_window": 16}),
    "gpt2": ("gpt2", {}),
}


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_dir(request: pytest.FixtureRequest, model_root: Path) -> Path:
    arch, kwargs = ARCHS[request.param]
    out = model_root / f"arch-{request.param}"
    if not out.exists():
        build_tiny("s", out, arch=arch, **kwargs)
    return out
