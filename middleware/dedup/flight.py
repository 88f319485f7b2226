"""One shared generation (a *flight*) and the handles that listen to it.

A flight holds every delta its generation produced so far and wakes its listeners when more
arrive; it ends with exactly one finished delta (the engine's last one, or an error). A handle
(`SharedGeneration`) reads the flight from the start at its own pace, so a late joiner first
gets the deltas so far, then live ones, and is iterated exactly like the engine's
`RequestGroup` (both satisfy `OutputSource`). Closing a handle only stops it listening; the
flight's owner (`DedupCache`) is told when the last listener leaves before the end, and when
the flight ends.

Knows nothing of Redis, HTTP or how the deltas are produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import TracebackType

from models import FinishReason, RequestOutput

FlightCallback = Callable[["Flight"], None]


class Flight:
    """One shared generation: every delta so far, and how many handles listen."""

    def __init__(
        self, key: str, *, on_done: FlightCallback | None = None, on_abandoned: FlightCallback | None = None
    ) -> None:
        loop = asyncio.get_running_loop()
        self.key = key
        self.request_id = f"dedup-{key[:16]}"
        self.outputs: list[RequestOutput] = []
        self.num_listeners = 0
        self.cache_ttl: float | None = None  # None: the full TTL
        self.task: asyncio.Task[None] | None = None
        self.started = loop.create_future()  # set once the creator may return (engine or result reached)
        self.start_error: Exception | None = None  # start() failed before `started`: the creator raises it
        self._changed = loop.create_future()
        self._on_done = on_done  # called once, with the last delta in place
        self._on_abandoned = on_abandoned  # the last listener left before the end

    @classmethod
    def replay(cls, key: str, outputs: list[RequestOutput]) -> Flight:
        flight = cls(key)
        flight.outputs = outputs
        return flight

    @property
    def done(self) -> bool:
        return bool(self.outputs) and self.outputs[-1].finished

    @property
    def succeeded(self) -> bool:
        return self.done and self.outputs[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)

    def listen(self) -> SharedGeneration:
        self.num_listeners += 1
        return SharedGeneration(self)

    def unlisten(self) -> None:
        self.num_listeners -= 1
        if self.num_listeners == 0 and not self.done and self._on_abandoned is not None:
            self._on_abandoned(self)

    def extend(self, outputs: list[RequestOutput]) -> None:
        self.outputs += outputs
        changed, self._changed = self._changed, asyncio.get_running_loop().create_future()
        changed.set_result(None)
        if self.done and self._on_done is not None:
            self._on_done(self)

    def fail(self, message: str) -> None:
        if not self.done:
            last = self.outputs[-1] if self.outputs else None
            num_prompt, num_output = (last.num_prompt_tokens, last.num_output_tokens) if last else (0, 0)
            self.extend(
                [RequestOutput(self.request_id, "", [], num_prompt, num_output, [], FinishReason.ERROR, message)]
            )

    def mark_started(self) -> None:
        if not self.started.done():
            self.started.set_result(None)

    async def wait_changed(self, timeout: float | None) -> None:
        # asyncio.wait neither wraps the future in a task nor cancels it on timeout.
        await asyncio.wait((self._changed,), timeout=timeout)


class SharedGeneration:
    """One request's view of a flight, iterated exactly like a `RequestGroup`.

    Leaving `async with` (or `close()`) stops this handle listening; it aborts the engine
    request only if it was the last listener and the generation had not finished.
    """

    def __init__(self, flight: Flight) -> None:
        self.request_ids = [flight.request_id]
        self.index = {flight.request_id: 0}
        self._flight = flight
        self._cursor = 0
        self._finished = False
        self._closed = False

    @property
    def finished(self) -> bool:
        return self._finished

    async def __aenter__(self) -> SharedGeneration:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._flight.unlisten()

    async def next_outputs(self, timeout: float | None = None) -> list[RequestOutput]:
        """Every delta this handle has not seen, waiting up to `timeout` for one; [] on timeout."""
        flight = self._flight
        if self._cursor == len(flight.outputs) and not flight.done:
            await flight.wait_changed(timeout)
        outputs = flight.outputs[self._cursor :]
        self._cursor += len(outputs)
        if outputs and outputs[-1].finished:
            self._finished = True
        return outputs

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        while not self._finished:
            for output in await self.next_outputs():
                yield output
