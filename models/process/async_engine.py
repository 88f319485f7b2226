"""The asyncio face of the engine: submit a request, iterate its outputs, abort on exit.

The event loop never touches torch: it only hands requests to the engine and takes outputs
from per-request queues. The engine runs in a child process by default (models/process/parent.py:
its outputs are read on the event loop when the pipe is readable) or on a thread of this
process (`separate_process=False`: each step's outputs come with one `call_soon_threadsafe`).

Use a request as an async context manager: leaving the block before the request finished
(client gone, task cancelled, exception) aborts it in the engine, so its slot or queue
place is free by the next step.

The load figures the server degrades by are kept here, one sample per request and by tier, from
the outputs each request's group receives (models/load/requests.py): the same in both engine modes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Protocol

from models.config import EngineConfig
from models.engine.observer import NULL_OBSERVER, EngineObserver
from models.engine.outputs import EngineDeadError, RequestOutput
from models.grammar.compiler import GrammarCompiler
from models.kv.prefix_cache import PrefixCacheStats
from models.load.host import HostSampler
from models.load.requests import RequestLoad, RequestTrack
from models.load.stats import ALL_TIERS, LoadSnapshot
from models.load.step_times import StepTimesObserver
from models.loading.tokenizer import Tokenizer
from models.process.parent import EngineProcess
from models.process.spawn import SpawnedEngine
from models.runner.gpu import GpuStat
from models.sampling.params import SamplingParams

if sys.version_info >= (3, 11):
    _timeout = asyncio.timeout
else:  # pragma: no cover - Python 3.10

    class _timeout:
        """asyncio.timeout for 3.10: cancel the awaiting task after `delay` seconds."""

        def __init__(self, delay: float | None) -> None:
            self._delay = delay
            self._handle: asyncio.TimerHandle | None = None
            self._expired = False

        async def __aenter__(self) -> None:
            if self._delay is not None:
                task = asyncio.current_task()
                assert task is not None
                self._handle = asyncio.get_running_loop().call_later(self._delay, self._expire, task)

        def _expire(self, task: asyncio.Task[object]) -> None:
            self._expired = True
            task.cancel()

        async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
            if self._handle is not None:
                self._handle.cancel()
            if self._expired and exc_type is asyncio.CancelledError:
                raise TimeoutError


class RequestGroup:
    """The outputs of one API request's sequences (n choices), in engine order, on one queue.

    `next_outputs(timeout)` returns [] when nothing arrived in time (the caller sends a
    keep-alive). Leaving the `async with` block aborts every sequence not yet finished.
    """

    def __init__(self, engine: AsyncEngine, request_ids: list[str], track: RequestTrack | None = None) -> None:
        self.request_ids = request_ids
        self.index = {request_id: i for i, request_id in enumerate(request_ids)}
        self._engine = engine
        self._track = track  # the request as the load figures see it
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._unfinished = set(request_ids)

    @property
    def finished(self) -> bool:
        return not self._unfinished

    async def __aenter__(self) -> RequestGroup:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        for request_id in self.request_ids:
            self._engine._groups.pop(request_id, None)
        for request_id in self._unfinished:
            self._engine.abort(request_id)
        self._unfinished.clear()
        if self._track is not None:
            self._track.end()

    def put(self, output: RequestOutput) -> None:
        if self._track is not None:
            self._track.output(output)  # as it arrives, not as the route reads it
        self._queue.put_nowait(output)

    async def next_outputs(self, timeout: float | None = None) -> list[RequestOutput]:
        """Every output that has arrived, waiting up to `timeout` for the first; [] on timeout.

        Taking all that is queued lets a caller that fell behind catch up in one write.
        """
        queue = self._queue
        if queue.empty():
            try:
                async with _timeout(timeout):
                    outputs = [await queue.get()]
            except TimeoutError:
                return []
        else:
            outputs = [queue.get_nowait()]
        while not queue.empty():
            outputs.append(queue.get_nowait())
        for output in outputs:
            if output.finished:
                self._unfinished.discard(output.request_id)
        return outputs

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            for output in await self.next_outputs():
                yield output


class EngineHandle(Protocol):
    """What the server needs of an engine: an `EngineCore` on a thread of this process, or an
    `EngineProcess` standing for one in a child process."""

    @property
    def dead(self) -> BaseException | None: ...
    @property
    def is_warm(self) -> bool: ...
    @property
    def full_step_seconds(self) -> float: ...
    @property
    def is_alive(self) -> bool: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def num_waiting_tokens(self) -> int: ...
    @property
    def num_running(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def num_aborted(self) -> int: ...
    @property
    def num_preempted(self) -> int: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def prefix_cache_stats(self) -> PrefixCacheStats: ...

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
        share: str = "",
        tier: int = 0,
        user: str = "",
    ) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def stop(self, timeout: float = 10.0) -> None: ...
    def gpu_stats(self) -> list[GpuStat]: ...


class AsyncEngine:
    def __init__(
        self,
        core: EngineHandle,
        tokenizer: Tokenizer,
        config: EngineConfig,
        groups: dict[str, RequestGroup],
        observer: EngineObserver = NULL_OBSERVER,
        grammars: GrammarCompiler | None = None,
        load: RequestLoad | None = None,
    ) -> None:
        """`grammars`: the engine's own compiler when it runs in this process (a grammar checked
        here is then compiled once, and found compiled when submitted); `load`: the figures the
        engine's observer (wrapped by `start`) records its step times into."""
        self.core = core
        self.tokenizer = tokenizer
        # The server's side of grammars: checks a request's grammar before it is submitted (an
        # engine in its own process compiles its own copy). Its compile times are the ones observed.
        self.grammars = grammars or GrammarCompiler(
            tokenizer.hf, tokenizer.vocab_size, tokenizer.eos_token_ids, on_compiled=observer.on_grammar_compiled
        )
        self.config = config
        self._groups = groups  # request id -> its group; shared with the publish callback
        self._ids = itertools.count()
        self.load = load or RequestLoad()  # per request and tier, fed by the groups
        self.host = HostSampler()

    @classmethod
    async def start(
        cls,
        config: EngineConfig,
        observer: EngineObserver = NULL_OBSERVER,
        process_init: Callable[[], None] | None = None,
        spawned: SpawnedEngine | None = None,
    ) -> AsyncEngine:
        """Start the engine (in a child process or on a thread, per `config.separate_process`)
        and wait until it is warm. `process_init` runs first in a child process (logging);
        `spawned` is a child process started earlier (models/process/spawn.py), adopted as is."""
        loop = asyncio.get_running_loop()
        load = RequestLoad()
        observer = StepTimesObserver(observer, load.stats)
        groups: dict[str, RequestGroup] = {}
        dispatch = functools.partial(_dispatch, groups)
        if config.separate_process or spawned is not None:
            process = EngineProcess(config, dispatch, observer, loop, process_init, spawned)
            tokenizer = await process.wait_started()
            engine = cls(process, tokenizer, process.engine_config, groups, observer, load=load)
            await asyncio.to_thread(engine.grammars.prepare)
            return engine
        # Imported here, not at the top: with the engine in a child process this process never
        # imports torch or transformers' models (seconds of start-up, hundreds of MiB).
        from models.engine.core import EngineCore
        from models.engine.own_thread import start_on_own_thread
        from models.loading.loader import load_model, resolve_engine_config

        def publish_threadsafe(outputs: list[RequestOutput]) -> None:
            # One hop per step, not per request. A closed loop raises RuntimeError: nobody listens.
            if outputs:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(dispatch, outputs)

        resolved: list[EngineConfig] = []

        def build() -> EngineCore:
            loaded = load_model(config.model)
            resolved.append(resolve_engine_config(config, loaded))
            return EngineCore(loaded, resolved[0].scheduler, publish_threadsafe, observer=observer)

        # The model loads on the thread that runs the loop (models/engine/own_thread.py says why).
        core = await asyncio.wrap_future(start_on_own_thread(build))
        config = resolved[0]
        while not core.is_warm:
            if core.dead is not None:
                raise EngineDeadError(f"warmup failed: {core.dead!r}")
            await asyncio.sleep(0.02)
        engine = cls(core, core.tokenizer, config, groups, observer, core.grammars, load)
        await asyncio.to_thread(engine.grammars.prepare)
        return engine

    def stop(self) -> None:
        self.core.stop()

    @property
    def is_ready(self) -> bool:
        return self.core.is_warm and self.core.is_alive

    def submit(
        self,
        sequences: Sequence[tuple[list[int], SamplingParams]],
        priority: int = 0,
        request_id: str | None = None,
        share: str = "",
        tier: int = 0,
        user: str = "",
    ) -> RequestGroup:
        """Queue one sequence per (prompt token ids, params) pair, e.g. n choices of one prompt;
        `share`: whose share of the queue they take (the caller's API key: models/scheduler/fair_shares.py),
        `user`: whose place within it (the request's end user); `tier`: whose load figures the request
        counts in and whose running sequences it may preempt (lower = more important).

        Use the returned group with `async with`: leaving it aborts what has not finished.
        """
        if not self.is_ready:
            raise EngineDeadError("the engine is not running")
        base = request_id or f"req-{next(self._ids)}"
        ids = [base] if len(sequences) == 1 else [f"{base}-{i}" for i in range(len(sequences))]
        group = RequestGroup(self, ids, self.load.start(len(ids), tier, share))
        try:
            for sub_id, (prompt_token_ids, params) in zip(ids, sequences, strict=True):
                self._groups[sub_id] = group
                self.core.add_request(sub_id, prompt_token_ids, params, priority, share=share, tier=tier, user=user)
        except BaseException:
            group.close()  # what was sent is aborted; the load figures forget the request
            raise
        return group

    def abort(self, request_id: str) -> None:
        self.core.abort_request(request_id)

    def load_snapshot(self, tier: int | None = ALL_TIERS) -> LoadSnapshot:
        """The load as `tier` sees it: its own and the more important tiers' waiting sequences and
        requests' samples; the shared figures if it bears them. ALL_TIERS: the whole server's."""
        core, load = self.core, self.load
        queue_time_p90, ttft_p90, error_rate = load.window(tier)
        host = self.host.sample()
        gpus = core.gpu_stats()  # where CUDA runs: its memory and busy share, not the host's
        memory = max((used / total for _, used, total, _ in gpus if total), default=host.memory)
        busy = max((ratio for *_, ratio in gpus if ratio is not None), default=host.cpu)
        return LoadSnapshot(
            num_waiting=core.num_waiting if tier is None else load.num_waiting(tier),
            num_running=core.num_running,
            max_num_seqs=self.config.scheduler.max_num_seqs,
            queue_time_p90=queue_time_p90,
            ttft_p90=ttft_p90,
            error_rate=error_rate,
            kv_usage=core.kv_usage,
            num_waiting_tokens=core.num_waiting_tokens,
            step_time_p90=load.stats.step_time_p90(),
            full_step_seconds=core.full_step_seconds,
            memory_usage=memory,
            compute_usage=busy,
            bears_shared_load=tier is None or load.bears_shared_load(tier),
        )


def _dispatch(groups: dict[str, RequestGroup], outputs: list[RequestOutput]) -> None:
    """On the event loop: hand each output to its request's group."""
    for output in outputs:
        group = groups.get(output.request_id)
        if group is not None:
            group.put(output)
