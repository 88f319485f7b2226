"""The server's side of an engine process (models/process/child.py has the child's side).

`EngineProcess` stands where an in-process `EngineCore` would: requests and aborts go down a
pipe; outputs, observer events and the engine's figures come back, read on the event loop
when the pipe is readable (`loop.add_reader`: no thread, no hand-off). Figures the server
asks for on every request (waiting, running, KV use) are the engine's last report plus what
was sent since; observer events are replayed into the server's metrics. (The load windows are the
server's own, per request: models/load/requests.py.)

If the child dies (OOM kill, crash, its loop died), every request still open gets an error
output and `dead` says why; /ready turns 503 and the process supervisor (Kubernetes) restarts
the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import select
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection

from models.config import EngineConfig, SchedulerConfig
from models.engine.observer import EngineObserver
from models.engine.outputs import ENGINE_STOPPED, EngineDeadError, RequestOutput
from models.kv.prefix_cache import PrefixCacheStats
from models.loading.tokenizer import Tokenizer
from models.process.messages import (
    IDLE_STATS,
    AbortRequest,
    AddRequests,
    AdmittedEvent,
    Died,
    EngineEvent,
    FinishEvent,
    FirstTokenEvent,
    FromEngine,
    GpuReport,
    GrammarMasksEvent,
    KvEventsEvent,
    Loaded,
    LoadFailed,
    NewRequest,
    StepEvent,
    StepReport,
    StopEngine,
    ToEngine,
    TokenGapsEvent,
    output_from_wire,
)
from models.process.spawn import SpawnedEngine, spawn_engine
from models.runner.gpu import GpuStat
from models.sampling.params import SamplingParams
from models.scheduler.sequence import FinishReason

log = logging.getLogger("surge.engine")

Publish = Callable[[list[RequestOutput]], None]


class EngineProcess:
    """An engine running in a child process, seen from the event loop."""

    def __init__(
        self,
        config: EngineConfig,
        publish: Publish,
        observer: EngineObserver,
        loop: asyncio.AbstractEventLoop,
        init: Callable[[], None] | None = None,
        spawned: SpawnedEngine | None = None,
    ) -> None:
        """`spawned`: a child already started with `spawn_engine` (its config wins); else one is
        started here with `config` and `init`."""
        self._publish = publish
        self._observer = observer
        self._loop = loop
        self.dead: BaseException | None = None
        self._stats = IDLE_STATS
        self._num_sent = 0
        self._open: set[str] = set()  # sent and not finished nor aborted
        self._gpu_stats: list[GpuStat] = []
        self._send_lock = threading.Lock()  # stop() runs on a worker thread
        self._outgoing = bytearray()  # framed messages the pipe did not take yet
        # Requests submitted in this event-loop iteration, sent as one ADD message at its end: a
        # burst of streams reaches the engine together and fills one step, instead of its first
        # request waking the engine into a step of one (and one write per request).
        self._adds: list[NewRequest] = []
        self._loop_thread = threading.get_ident()  # built on the loop's thread
        self._is_writer_on = False  # the loop watches the pipe for room
        self._stopping = False
        self._loaded: asyncio.Future[Loaded] = loop.create_future()
        self._warm = asyncio.Event()
        # A child started early (`surge serve` spawns it before importing the server) or now.
        spawned = spawned if spawned is not None else spawn_engine(config, init)
        self.engine_config = spawned.config  # the scheduler's resolved once the child reports it
        self._requests: Connection = spawned.requests
        self._messages: Connection = spawned.messages
        self._process = spawned.process
        loop.add_reader(self._messages.fileno(), self._on_readable)
        os.set_blocking(self._requests.fileno(), False)  # see _send
        # NOTE: uvloop (libuv's uv_poll_init) makes a watched fd non-blocking, and then `recv` of a
        # message only partly in the pipe (larger than the pipe's 64 KiB, or written while it was
        # full) raises BlockingIOError, an OSError, which read as "the engine exited". Blocking
        # reads wait for the rest, which the child is writing.
        os.set_blocking(self._messages.fileno(), True)

    # --- start-up -------------------------------------------------------------------------

    async def wait_started(self) -> Tokenizer:
        """Wait for the model to load (raise if it failed), take its tokenizer, wait for warmup."""
        try:
            loaded = await self._loaded
            self.engine_config = replace(self.engine_config, scheduler=loaded.scheduler)
            # The tokenizer unpickles here while the child warms up.
            hf_tokenizer = await asyncio.to_thread(pickle.loads, loaded.tokenizer)
            tokenizer = Tokenizer(hf_tokenizer, loaded.eos_token_ids)
            await self._warm.wait()
            if self.dead is not None:
                raise EngineDeadError(f"warmup failed: {self.dead}")
            return tokenizer
        except BaseException:
            await asyncio.to_thread(self.stop, 2.0)
            raise

    # --- what the server calls (on the event loop) -------------------------------------------

    @property
    def config(self) -> SchedulerConfig:
        return self.engine_config.scheduler

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
    ) -> None:
        if self.dead is not None:
            raise EngineDeadError(ENGINE_STOPPED)
        arrived = time.monotonic() if arrival_time is None else arrival_time  # one clock for both processes
        with self._send_lock:
            self._adds.append(NewRequest(request_id, prompt_token_ids, params, priority, arrived, share, tier, user))
            first = len(self._adds) == 1
        if first:
            if threading.get_ident() == self._loop_thread:
                self._loop.call_soon(self._send_adds)  # after the rest of this iteration's callbacks
            else:
                self._loop.call_soon_threadsafe(self._send_adds)
        self._num_sent += 1
        self._open.add(request_id)

    def abort_request(self, request_id: str) -> None:
        self._open.discard(request_id)
        if self.dead is None:
            self._send_adds()  # an abort must not overtake its request's ADD
            self._send(AbortRequest(request_id))

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the child to stop (it fails what is still open), wait for it, then make sure."""
        self._stopping = True
        started = time.monotonic()
        try:
            self._send_stop(timeout)
        except TimeoutError as exc:
            log.warning("%s", exc)
        except (OSError, ValueError):
            pass  # the child is gone already
        self._process.join(max(0.0, timeout - (time.monotonic() - started)))
        if self._process.is_alive():
            log.warning("the engine process did not stop in %.0f s; killing it", timeout)
            self._process.kill()
            self._process.join(5)
        with contextlib.suppress(OSError):
            self._requests.close()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def is_warm(self) -> bool:
        return self._stats.is_warm

    @property
    def full_step_seconds(self) -> float:
        return self._stats.full_step_seconds

    @property
    def is_alive(self) -> bool:
        return self.dead is None and not self._stopping

    @property
    def num_waiting(self) -> int:
        # The child's queue and inbox as of its last report, plus requests sent since.
        stats = self._stats
        return stats.num_waiting + max(0, self._num_sent - stats.num_received)

    @property
    def num_waiting_tokens(self) -> int:
        return self._stats.num_waiting_tokens

    @property
    def num_running(self) -> int:
        return self._stats.num_running

    @property
    def kv_usage(self) -> float:
        return self._stats.kv_usage

    @property
    def num_aborted(self) -> int:
        return self._stats.num_aborted

    @property
    def num_preempted(self) -> int:
        return self._stats.num_preempted

    @property
    def num_steps(self) -> int:
        return self._stats.num_steps

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self._stats.prefix_cache

    def gpu_stats(self) -> list[GpuStat]:
        return self._gpu_stats  # as the engine process last read them

    # --- the pipe -----------------------------------------------------------------------------

    def _send_adds(self) -> None:
        with self._send_lock:
            adds, self._adds = self._adds, []
        if adds and self.dead is None:
            self._send(AddRequests(adds))

    def _send(self, message: ToEngine) -> None:
        """Queue one message (multiprocessing's framing, so the child's `Connection.recv` reads
        it) and write what the pipe takes now; on the event loop this never blocks: a busy child
        may leave the pipe full for a whole step, and the loop has streams to serve meanwhile."""
        framed = _frame(message)
        with self._send_lock:
            self._outgoing += framed
            if not self._is_writer_on:
                self._flush()

    def _flush(self) -> None:
        """Write queued bytes until the pipe is full; watch for room if some are left (lock held)."""
        fd = self._requests.fileno()
        while self._outgoing:
            try:
                written = os.write(fd, self._outgoing)
            except BlockingIOError:
                break
            except OSError:  # the child is gone: EOF on its pipe fails what was sent
                self._outgoing.clear()
                break
            del self._outgoing[:written]
        wanted = bool(self._outgoing)
        if wanted != self._is_writer_on:
            if wanted:
                self._loop.add_writer(fd, self._on_writable)
            else:
                self._loop.remove_writer(fd)
            self._is_writer_on = wanted

    def _on_writable(self) -> None:
        with self._send_lock:
            self._flush()

    def _send_stop(self, timeout: float) -> None:
        """STOP, from any thread (the server stops the engine from a worker thread): written after
        whatever is still queued, so the child reads everything before it; within `timeout`, as
        a child too frozen to read its pipe must not hold up shutdown (stop() kills it)."""
        deadline = time.monotonic() + timeout
        with self._send_lock:
            if self._adds:  # not sent yet: the child fails them on STOP, as it fails what it holds
                self._outgoing += _frame(AddRequests(self._adds))
                self._adds = []
            data = bytes(self._outgoing) + _frame(StopEngine())
            self._outgoing.clear()
            fd = self._requests.fileno()
            view = memoryview(data)
            while view:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the engine process read no STOP in {timeout:.0f} s")
                if select.select([], [fd], [], remaining)[1]:
                    with contextlib.suppress(BlockingIOError):  # the fd stays non-blocking
                        view = view[os.write(fd, view) :]

    def _on_readable(self) -> None:
        messages = self._messages
        while True:
            try:
                message = messages.recv()
            except (EOFError, OSError):  # only the pipe's own failures mean the child is gone
                self._on_exit()
                return
            self._handle(message)
            if not messages.poll():
                return

    def _handle(self, message: FromEngine) -> None:
        if isinstance(message, StepReport):
            self._stats = message.stats
            if message.events:
                self._replay(message.events)
            if message.outputs:
                outputs = [output_from_wire(wire) for wire in message.outputs]
                open_ids = self._open
                for output in outputs:
                    if output.finished:
                        open_ids.discard(output.request_id)
                self._publish(outputs)
            if message.stats.is_warm and not self._warm.is_set():
                self._warm.set()
        elif isinstance(message, GpuReport):
            self._gpu_stats = message.stats
        elif isinstance(message, Loaded):
            if not self._loaded.done():
                self._loaded.set_result(message)
        elif isinstance(message, LoadFailed):
            self._die(EngineDeadError(f"could not load the model: {message.message}"))
        elif isinstance(message, Died):
            self._die(EngineDeadError(message.message))

    def _replay(self, events: list[EngineEvent]) -> None:
        observer = self._observer
        for event in events:
            if isinstance(event, TokenGapsEvent):
                observer.on_token_gaps(event.gaps)
            elif isinstance(event, StepEvent):
                observer.on_step(event.num_seqs, event.num_prompt_tokens, event.num_generated_tokens, event.seconds)
            elif isinstance(event, FirstTokenEvent):
                observer.on_first_token(event.ttft)
            elif isinstance(event, AdmittedEvent):
                observer.on_admitted(event.queue_time)
            elif isinstance(event, FinishEvent):
                observer.on_finish(event.reason, event.e2e)
            elif isinstance(event, GrammarMasksEvent):
                observer.on_grammar_masks(event.seconds)
            elif isinstance(event, KvEventsEvent):
                observer.on_kv_events(event.events)

    def _on_exit(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._messages.fileno())
        with contextlib.suppress(OSError):
            self._messages.close()
        if self._stopping:
            self._die(EngineDeadError("the server is shutting down"), quiet=True)
        else:
            self._process.join(1)
            self._die(EngineDeadError(f"the engine process exited (exit code {self._process.exitcode})"))

    def _die(self, error: EngineDeadError, quiet: bool = False) -> None:
        if self.dead is None:
            self.dead = error
            if not quiet:
                log.error("%s", error)
        if not self._loaded.done():
            self._loaded.set_exception(error)
        self._warm.set()
        stats = self._stats  # a dead engine runs and holds nothing
        self._stats = stats._replace(num_waiting=0, num_waiting_tokens=0, num_running=0, kv_usage=0.0)
        self._num_sent = stats.num_received
        # Requests the child never answered (in the pipe, or open when it died) end with the error.
        if self._open:
            message = str(error)
            failed = [
                RequestOutput(request_id, "", [], 0, 0, [], FinishReason.ERROR, message) for request_id in self._open
            ]
            self._open.clear()
            self._publish(failed)


def _frame(message: ToEngine) -> bytes:
    """One message as multiprocessing's framing has it (so the child's `Connection.recv` reads it)."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack("!i", len(payload)) + payload
