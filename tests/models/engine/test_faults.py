"""The fault-injection hook (models/engine/faults.py): off unless asked, and exact about which step fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.config import EngineConfig, ModelConfig, SchedulerConfig
from models.engine.faults import FORWARD_ERROR_STEPS_ENV, ForwardFaults, InjectedFault, forward_faults_from_env
from models.engine.outputs import MODEL_FAILED
from models.process.async_engine import AsyncEngine
from models.sampling.params import SamplingParams
from models.scheduler.sequence import FinishReason


def test_off_unless_the_variable_names_steps() -> None:
    assert forward_faults_from_env({}) is None
    assert forward_faults_from_env({FORWARD_ERROR_STEPS_ENV: ""}) is None
    assert forward_faults_from_env({FORWARD_ERROR_STEPS_ENV: "  "}) is None


def test_exactly_the_named_forward_passes_raise() -> None:
    faults = forward_faults_from_env({FORWARD_ERROR_STEPS_ENV: "2, 4"})
    assert faults is not None
    raised = []
    for step in range(1, 6):
        try:
            faults.before_forward()
        except InjectedFault as exc:
            assert f"step {step}" in str(exc)
            raised.append(step)
    assert raised == [2, 4]


@pytest.mark.parametrize("raw", ["two", "1;2", "0", "-3"])
def test_bad_values_are_refused_with_the_variable_named(raw: str) -> None:
    with pytest.raises(ValueError, match=FORWARD_ERROR_STEPS_ENV):
        forward_faults_from_env({FORWARD_ERROR_STEPS_ENV: raw})


def test_steps_are_counted_from_one() -> None:
    faults = ForwardFaults(frozenset({1}))
    with pytest.raises(InjectedFault):
        faults.before_forward()
    faults.before_forward()  # step 2: passes
    assert faults.num_forwards == 2


async def test_the_engine_fails_the_named_step_after_warmup_and_goes_on(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORWARD_ERROR_STEPS_ENV, "3")  # read by the engine when it is built
    config = EngineConfig(
        ModelConfig(str(tiny_model_dir), device="cpu", dtype="float32"),
        SchedulerConfig(max_model_len=128),
        separate_process=False,
    )
    engine = await AsyncEngine.start(config)  # warmup runs many steps: none of them counts
    try:
        params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
        async with engine.submit([([5, 6, 7], params)]) as group:
            failed = [out async for out in group]
        # Steps 1 and 2 (prefill, one decode) gave a token each; step 3 raised.
        assert [len(out.token_ids) for out in failed] == [1, 1, 0]
        assert failed[-1].finish_reason is FinishReason.ERROR
        assert failed[-1].error == MODEL_FAILED  # the fault's own text is in the log only
        async with engine.submit([([5, 6, 7], params)]) as group:
            after = [out async for out in group]
        assert sum(len(out.token_ids) for out in after) == 10 and after[-1].finish_reason is FinishReason.LENGTH
        assert engine.is_ready
    finally:
        engine.stop()
