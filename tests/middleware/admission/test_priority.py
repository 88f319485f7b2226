"""The engine's order: the tier first, the body's priority only within it."""

from __future__ import annotations

import pytest

from middleware.admission.priority import MAX_PRIORITY, check_priority, engine_priority
from middleware.errors import OpenAIError


def test_no_body_priority_reaches_another_tier() -> None:
    assert engine_priority(-1, MAX_PRIORITY) < engine_priority(0, -MAX_PRIORITY)
    assert engine_priority(0, MAX_PRIORITY) < engine_priority(1, -MAX_PRIORITY)
    assert engine_priority(0, 0) < engine_priority(0, 1) < engine_priority(1, 0)
    assert engine_priority(0, 0) == 0  # the default request keeps the engine's default


def test_below_the_keys_floor_is_a_400_naming_priority() -> None:
    check_priority(0, 0)
    check_priority(-3, -3)
    for priority, floor in ((-1, 0), (-4, -3)):
        with pytest.raises(OpenAIError) as caught:
            check_priority(priority, floor)
        assert caught.value.status_code == 400 and caught.value.param == "priority"
