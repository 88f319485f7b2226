"""The echo model: the real engine loop, scheduler, sampler and detokenizer, with no forward pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch

from models.config import EngineConfig, ModelConfig, SchedulerConfig
from models.engine.outputs import RequestOutput
from models.loading import tiny
from models.process.async_engine import AsyncEngine
from models.runner.echo import ECHO_TEXT, EchoRunner
from models.sampling.params import SamplingParams
from models.scheduler.sequence import FinishReason


@pytest.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    config = EngineConfig(
        ModelConfig("echo", device="cpu"),
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
        separate_process=False,
    )
    engine = await AsyncEngine.start(config)
    yield engine
    engine.stop()


async def collect(engine: AsyncEngine, prompt: list[int], params: SamplingParams) -> list[RequestOutput]:
    outputs = []
    async with engine.submit([(prompt, params)]) as group:
        async for out in group:
            outputs.append(out)
    return outputs


async def test_echo_loads_no_weights(engine: AsyncEngine) -> None:
    assert isinstance(engine.core.runner, EchoRunner)
    assert engine.is_ready
    assert engine.config.scheduler.max_model_len == tiny.MAX_POSITION_EMBEDDINGS  # the tiny model's, no weights read


async def test_concurrent_requests_each_get_exactly_max_tokens(engine: AsyncEngine) -> None:
    # More requests than slots, so some wait, join mid-flight and leave at different steps.
    lengths = [1, 5, 17, 33, 64, 9, 40, 2, 25, 12, 50, 7]
    prompts = [engine.tokenizer.encode("hello " * (i + 1)) for i in range(len(lengths))]
    results = await asyncio.wait_for(
        asyncio.gather(
            *(
                collect(engine, p, SamplingParams(max_tokens=n, temperature=0.0))
                for p, n in zip(prompts, lengths, strict=True)
            )
        ),
        timeout=30,
    )
    for outputs, n in zip(results, lengths, strict=True):
        assert sum(len(out.token_ids) for out in outputs) == n
        assert outputs[-1].finish_reason is FinishReason.LENGTH
        assert all(out.finish_reason is None for out in outputs[:-1])
        text = "".join(out.text for out in outputs)
        assert text and set(text) <= set(ECHO_TEXT)  # printable, from the echo cycle


async def test_sampled_requests_echo_too(engine: AsyncEngine) -> None:
    outputs = await collect(engine, [5, 6, 7], SamplingParams(max_tokens=20, temperature=1.0, seed=3))
    assert sum(len(out.token_ids) for out in outputs) == 20
    assert set("".join(out.text for out in outputs)) <= set(ECHO_TEXT)


async def test_abort_frees_the_slot(engine: AsyncEngine) -> None:
    group = engine.submit([([5, 6, 7], SamplingParams(max_tokens=2000, temperature=0.0))])
    async with group:
        async for _ in group:
            break  # the client goes away after its first token
    deadline = asyncio.get_running_loop().time() + 10
    while engine.core.num_running or engine.core._requests:
        assert asyncio.get_running_loop().time() < deadline, "the aborted request still runs"
        await asyncio.sleep(0.005)
    assert engine.core.num_aborted == 1
    # The engine goes on serving.
    outputs = await collect(engine, [5], SamplingParams(max_tokens=3, temperature=0.0))
    assert sum(len(out.token_ids) for out in outputs) == 3


def test_echo_runner_rows_cycle_from_step_to_step() -> None:
    runner = EchoRunner([10, 11, 12], vocab_size=32, max_num_seqs=4)
    decodes = [object()] * 4  # the runner reads only how many there are
    steps = [runner.forward(4, [], decodes).argmax(-1).tolist() for _ in range(3)]  # type: ignore[arg-type]
    assert steps == [[10, 11, 12, 10], [11, 12, 10, 11], [12, 10, 11, 12]]
    assert runner.forward(4, [], decodes[:2]).dtype == torch.float32  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        runner.forward(5, [], [object()] * 5)  # type: ignore[list-item]
    with pytest.raises(ValueError):
        EchoRunner([40], vocab_size=32, max_num_seqs=1)
