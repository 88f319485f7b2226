"""Fault injection for tests: make chosen forward passes raise, in whichever process runs the engine.

The engine usually runs in a child process (models/process/child.py), where a test's
monkeypatching cannot reach, so the hook is read from the environment, which the child inherits:

    SURGE_FAULT_FORWARD_ERROR_STEPS=5,8,40 surge serve ...

makes the 5th, 8th and 40th forward passes after warmup raise `InjectedFault` (counted from 1;
every step that runs the model counts, failed ones included). The engine then does what it does
for any failed forward pass: that step's requests get an error and the loop goes on.

Off by default: with the variable unset or empty, `forward_faults_from_env()` returns None and
the engine pays one `is None` check per step. Must not know HTTP or the app.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

FORWARD_ERROR_STEPS_ENV = "SURGE_FAULT_FORWARD_ERROR_STEPS"


class InjectedFault(RuntimeError):
    """Raised by a forward pass that a test asked to fail."""


class ForwardFaults:
    """Counts forward passes and raises `InjectedFault` on the chosen ones."""

    def __init__(self, error_steps: frozenset[int]) -> None:
        if any(step < 1 for step in error_steps):
            raise ValueError(f"{FORWARD_ERROR_STEPS_ENV}: steps are counted from 1")
        self.error_steps = error_steps
        self.num_forwards = 0

    def before_forward(self) -> None:
        self.num_forwards += 1
        if self.num_forwards in self.error_steps:
            raise InjectedFault(f"injected forward failure at step {self.num_forwards} ({FORWARD_ERROR_STEPS_ENV})")


def forward_faults_from_env(environ: Mapping[str, str] = os.environ) -> ForwardFaults | None:
    """The faults the environment asks for, or None (the normal case: nothing to inject)."""
    raw = environ.get(FORWARD_ERROR_STEPS_ENV, "").strip()
    if not raw:
        return None
    try:
        steps = frozenset(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{FORWARD_ERROR_STEPS_ENV} must be comma-separated step numbers, got {raw!r}") from None
    return ForwardFaults(steps)
