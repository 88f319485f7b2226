"""Fixtures for the engine's tests: one small model of each architecture we serve, and the
device the tests that take `device` run on.

`SURGE_TEST_DEVICE` (default `cpu`) moves those tests to another device, e.g.
`SURGE_TEST_DEVICE=cuda pytest tests/models/runner/test_model_runner.py tests/models/runner/test_architectures.py`
on a GPU machine (scripts/device_check.sh).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from models.loading.tiny import build_tiny

TEST_DEVICE = os.environ.get("SURGE_TEST_DEVICE", "cpu")

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
    if request.param == "llama":  # the very build of tiny_model_dir (4 s on the 2-core VM): made once a session
        return Path(request.getfixturevalue("tiny_model_dir"))
    out = model_root / f"arch-{request.param}"
    if not out.exists():
        build_tiny("s", out, arch=arch, **kwargs)
    return out


@pytest.fixture(scope="session")
def device() -> Iterator[str]:
    """The device the engine's model tests run on: `SURGE_TEST_DEVICE`, default `cpu`.

    On CUDA, float32 matmuls stay float32 (no TF32) while the tests run: they compare logits
    at 1e-4 and greedy tokens with transformers' own, which TF32's 10-bit mantissa would blur.
    """
    if not TEST_DEVICE.startswith("cuda"):
        yield TEST_DEVICE
        return
    if not torch.cuda.is_available():
        pytest.fail(f"SURGE_TEST_DEVICE={TEST_DEVICE} but torch sees no CUDA device")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield TEST_DEVICE
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
