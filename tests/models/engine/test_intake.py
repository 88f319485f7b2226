"""Grammars compiled off the thread that takes requests in, on the real tiny model (engine on a
thread; the engine process's pipe receiver calls the same `add_request`).

Compiles are held back by a gate around the compiler's compile (the library call itself still
runs): a request whose grammar compiles must hold up neither other submissions nor the batch.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from llguidance import LLMatcher

from models.grammar.compiler import JSON_OPTIONS, TOO_COMPLEX, json_schema_grammar
from models.process.async_engine import AsyncEngine
from models.sampling.params import SamplingParams
from models.scheduler.sequence import FinishReason
from tests.models.engine.test_core import EngineFactory, make_engine, prompt, run, tokens, wait_until

__all__ = ["make_engine"]  # the fixture, used by name

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "rank": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["city", "rank"],
}


class Gate:
    """Holds every compile of the engine's compiler until opened; records the compiling threads."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.opened = threading.Event()
        self.threads: list[str] = []
        compiler = engine.core.grammars  # type: ignore[attr-defined]
        compile_ = compiler._template

        def gated(grammar: str, scope: str) -> Any:
            if not compiler.is_compiled(grammar, scope):
                self.threads.append(threading.current_thread().name)
                assert self.opened.wait(30), "the gate was never opened"
            return compile_(grammar, scope)

        compiler._template = gated


@pytest.fixture
def gate_of() -> Iterator[type[Gate]]:
    yield Gate


def constrained(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=60, temperature=1.0, seed=seed, grammar=json_schema_grammar(SCHEMA, closed=True))


async def test_a_compiling_grammar_holds_up_no_other_submission(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=4)
    gate = Gate(engine)
    slow = engine.submit([(prompt(6, 1), constrained(1))], share="key:a")  # returns: nothing compiled here
    slow_outputs = asyncio.ensure_future(run(slow))
    (free,) = await run(engine.submit([(prompt(6, 2), SamplingParams(max_tokens=1))], share="key:b"))
    assert free[-1].finish_reason is FinishReason.LENGTH and len(tokens(free)) == 1
    assert not slow_outputs.done() and engine.core.num_waiting == 1  # still compiling, counted as waiting
    gate.opened.set()
    (outs,) = await slow_outputs
    assert outs[-1].finish_reason is FinishReason.STOP
    json.loads("".join(out.text for out in outs))
    assert gate.threads and all(name.startswith("surge-grammar-compile") for name in gate.threads)


async def test_an_abort_while_the_grammar_compiles_drops_the_request(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_num_seqs=4)
    gate = Gate(engine)
    group = engine.submit([(prompt(6, 3), constrained(3))], share="key:a")
    await wait_until(lambda: bool(gate.threads))
    async with group:
        pass  # leaving aborts: the abort reaches the loop before the request
    core = engine.core
    await wait_until(lambda: bool(core._inbox._intake._aborted))  # type: ignore[attr-defined]
    assert core.num_waiting == 1  # its compile is still work to do
    gate.opened.set()
    await wait_until(lambda: core.num_waiting == 0)
    assert not core.num_running and not core._requests  # type: ignore[attr-defined]
    assert not core._inbox._intake._compiling and not core._inbox._intake._aborted  # type: ignore[attr-defined]
    (after,) = await run(engine.submit([(prompt(6, 4), constrained(4))], share="key:a"))
    assert after[-1].finish_reason is FinishReason.STOP


async def test_a_grammar_that_overflows_mid_generation_is_the_clients_fault(make_engine: EngineFactory) -> None:
    """A schema past surge's check (made here without it) whose masks overflow the matcher's row
    bound: every sequence ends INVALID (a 4xx at the HTTP side), with a fixed sentence, and the
    request is one sample of the load figures, not a server error."""
    engine = await make_engine(max_num_seqs=4)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(600)}}
    grammar = str(LLMatcher.grammar_from_json_schema(schema, defaults=dict(JSON_OPTIONS)))  # type: ignore[arg-type]
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=5, grammar=grammar)
    outputs = await run(engine.submit([(prompt(6, 5), params), (prompt(6, 6), params)]))
    for outs in outputs:
        assert outs[-1].finish_reason is FinishReason.INVALID
        assert outs[-1].error is not None and outs[-1].error.endswith(TOO_COMPLEX)
    (finishes,) = engine.load.stats._finishes.values()
    assert len(finishes) == 1 and not any(is_error for _, is_error in finishes)  # one request, no server error
