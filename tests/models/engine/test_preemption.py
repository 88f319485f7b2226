"""Preemption by tier with the real tiny model: a preempted greedy stream resumes from its prompt
and what it had generated, and its tokens are the ones it would have produced alone."""

from __future__ import annotations

import asyncio

from tests.models.engine.test_core import EngineFactory, greedy, make_engine, prompt, run, tokens, wait_until

__all__ = ["make_engine"]  # the fixture, used by name


async def test_a_preempted_stream_resumes_token_for_token_and_the_better_tier_goes_first(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(max_num_seqs=2, max_num_batched_tokens=64)
    low_prompts = [prompt(40, seed=1), prompt(25, seed=2)]
    alone = [tokens((await run(engine.submit([(p, greedy(60))], tier=2)))[0]) for p in low_prompts]
    urgent_prompt = prompt(12, seed=3)
    urgent_alone = tokens((await run(engine.submit([(urgent_prompt, greedy(8))])))[0])

    low = [asyncio.create_task(run(engine.submit([(p, greedy(60))], tier=2))) for p in low_prompts]
    core = engine.core
    await wait_until(lambda: core.num_running == 2 and core.scheduler.running[1].num_output_tokens >= 10)
    urgent = await run(engine.submit([(urgent_prompt, greedy(8))], tier=0))
    assert core.scheduler.num_preempted == 1
    assert not all(task.done() for task in low)  # the urgent one finished while a slot was taken back
    resumed = [tokens(outputs[0]) for outputs in await asyncio.gather(*low)]
    assert resumed == alone
    assert tokens(urgent[0]) == urgent_alone
    assert core.scheduler.num_running == 0 and core.scheduler.num_waiting == 0
