"""The asyncio face of the engine: submit a request, iterate its outputs, abort on exit.

The event loop never touches torch: it only puts requests into the engine's inbox and takes
outputs from per-request queues. The engine thread publishes each step's outputs with one
`call_soon_threadsafe`, not one per request.

Use a request as an async context manager: leaving the block before the request finished
(client gone, task cancelled, exception) aborts it in the engine, so its slot or queue
place is free by the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from types import TracebackType

from models.config import EngineConfig
from models.engine import EngineCore
from models.load_stats import LoadSnapshot
from models.loader import LoadedModel, load_model
from models.observer import EngineObserver
from models.outputs import EngineDeadError, RequestOutput
from models.sampling_params import SamplingParams
from models.tokenizer import Tokenizer

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


# For models whose config states no context length (rare).
DEFAULT_MAX_MODEL_LEN = 2048


def resolve_max_model_len(config: EngineConfig, loaded: LoadedModel) -> EngineConfig:
    """Fill in max_model_len from the model when it was left at 0; never exceed the model's."""
    model_max = loaded.max_position_embeddings or DEFAULT_MAX_MODEL_LEN
    wanted = config.scheduler.max_model_len or model_max
    if wanted > model_max:
        raise ValueError(f"max_model_len {wanted} is larger than the model's limit {model_max}")
    return replace(config, scheduler=replace(config.scheduler, max_model_len=wanted))


class RequestGroup:
    """The outputs of one API request's sequences (n choices), in engine order, on one queue.

    `next_outputs(timeout)` returns [] when nothing arrived in time (the caller sends a
    keep-alive). Leaving the `async with` block aborts every sequence not yet finished.
    """

    def __init__(self, engine: AsyncEngine, request_ids: list[str]) -> None:
        self.request_ids = request_ids
        self.index = {request_id: i for i, request_id in enumerate(request_ids)}
        self._engine = engine
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

    def put(self, output: RequestOutput) -> None:
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


class AsyncEngine:
    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig,
        loop: asyncio.AbstractEventLoop,
        observer: EngineObserver | None = None,
    ) -> None:
        self._loop = loop
        self._groups: dict[str, RequestGroup] = {}
        self.core = EngineCore(loaded, config.scheduler, self._publish_threadsafe, observer=observer)
        self.tokenizer: Tokenizer = loaded.tokenizer
        self.config = config
        self._ids = itertools.count()

    @classmethod
    async def start(cls, config: EngineConfig, observer: EngineObserver | None = None) -> AsyncEngine:
        """Load the model off the event loop, start the engine thread and wait for warmup."""
        loop = asyncio.get_running_loop()
        loaded = await asyncio.to_thread(load_model, config.model)
        config = resolve_max_model_len(config, loaded)
        engine = cls(loaded, config, loop, observer)
        engine.core.start()
        while not engine.core.is_warm:
            if engine.core.dead is not None:
                raise EngineDeadError(f"warmup failed: {engine.core.dead!r}")
            await asyncio.sleep(0.02)
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
    ) -> RequestGroup:
        """Queue one sequence per (prompt token ids, params) pair, e.g. n choices of one prompt.

        Use the returned group with `async with`: leaving it aborts what has not finished.
        """
        if not self.is_ready:
            raise EngineDeadError(f"the engine is not running: {self.core.dead!r}")
        base = request_id or f"req-{next(self._ids)}"
        ids = [base] if len(sequences) == 1 else [f"{base}-{i}" for i in range(len(sequences))]
        group = RequestGroup(self, ids)
        for sub_id, (prompt_token_ids, params) in zip(ids, sequences, strict=True):
            self._groups[sub_id] = group
            self.core.add_request(sub_id, prompt_token_ids, params, priority)
        return group

    def abort(self, request_id: str) -> None:
        self.core.abort_request(request_id)

    def load_snapshot(self) -> LoadSnapshot:
        return self.core.load_snapshot()

    def _publish_threadsafe(self, outputs: list[RequestOutput]) -> None:
        # A closed event loop raises RuntimeError: nobody is listening any more.
        if outputs:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._dispatch, outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        groups = self._groups
        for output in outputs:
            group = groups.get(output.request_id)
            if group is not None:
                group.put(output)
