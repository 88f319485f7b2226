"""The engine in its own process: the child side (models/process/parent.py is the server's).

Why a process: the engine thread and the event loop share one GIL in one process, and on a
small CPU machine that costs a quarter to a third of the batch's tokens/s (docs/engine.md). In
its own process the engine's Python runs beside the event loop's, not in turns with it.

The child loads the model, runs `EngineCore.run()` on its main thread and talks to the server
over two one-way pipes, in the messages of models/process/messages.py: a receiver thread feeds
the core's inbox from the server's pipe (so the loop never waits on it), and the core's
per-iteration hook sends what one loop iteration produced as one `StepReport`. Observer events
travel in it too; the server replays them into its metrics and load figures, so models/ still
imports no metrics library.

The child ignores SIGINT, SIGTERM and SIGHUP: a Ctrl-C in a terminal reaches the whole process
group, and the server, not the signal, decides when the engine stops (after draining); SIGHUP is
the server's "reload the keys file", and one sent to the group must not end the engine.
The child exits on `StopEngine` or when the server's end of the pipe closes (the server died).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from models.config import EngineConfig
from models.engine.core import EngineCore
from models.engine.outputs import ENGINE_STOPPED, RequestOutput
from models.kv.events import KvEvent
from models.loading.loader import load_model, resolve_engine_config
from models.process.messages import (
    AbortRequest,
    AddRequests,
    AdmittedEvent,
    Died,
    EngineEvent,
    EngineStats,
    FinishEvent,
    FirstTokenEvent,
    FromEngine,
    GpuReport,
    GrammarMasksEvent,
    KvEventsEvent,
    Loaded,
    LoadFailed,
    StepEvent,
    StepReport,
    TokenGapsEvent,
    WireOutput,
    output_to_wire,
)
from models.runner.gpu import read_gpu_stats
from models.scheduler.sequence import FinishReason

log = logging.getLogger("surge.engine")

# How often the engine process reads GPU memory and utilization for the server's metrics.
GPU_READ_SECONDS = 1.0


class RecordingObserver:
    """Collects the engine's observer calls as events until the next report goes out."""

    def __init__(self) -> None:
        self.events: list[EngineEvent] = []

    def on_step(self, num_seqs: int, num_prompt_tokens: int, num_generated_tokens: int, seconds: float) -> None:
        self.events.append(StepEvent(num_seqs, num_prompt_tokens, num_generated_tokens, seconds))

    def on_admitted(self, queue_time: float) -> None:
        self.events.append(AdmittedEvent(queue_time))

    def on_first_token(self, ttft: float) -> None:
        self.events.append(FirstTokenEvent(ttft))

    def on_token_gaps(self, gaps: list[float]) -> None:
        self.events.append(TokenGapsEvent(gaps))

    def on_finish(self, reason: FinishReason, e2e: float) -> None:
        self.events.append(FinishEvent(reason, e2e))

    def on_grammar_masks(self, seconds: float) -> None:
        self.events.append(GrammarMasksEvent(seconds))

    def on_grammar_compiled(self, seconds: float) -> None:
        pass  # the server compiles every new grammar first and reports it there

    def on_kv_events(self, events: list[KvEvent]) -> None:
        self.events.append(KvEventsEvent(events))


class _Outbox:
    """What one loop iteration produced, sent as one report when anything changed."""

    def __init__(self, conn: Connection, core_ref: list[EngineCore], observer: RecordingObserver) -> None:
        self.conn = conn
        self.core_ref = core_ref
        self.observer = observer
        self.outputs: list[WireOutput] = []
        self.num_received = 0  # requests taken from the pipe (the server counts what it sent)
        self.last_stats: EngineStats | None = None
        self.next_gpu_read = 0.0

    def publish(self, outputs: list[RequestOutput]) -> None:
        self.outputs.extend(map(output_to_wire, outputs))

    def flush(self) -> None:
        now = time.monotonic()
        if now >= self.next_gpu_read:
            self.next_gpu_read = now + GPU_READ_SECONDS
            gpu_stats = read_gpu_stats()  # [] on CPU: nothing sent
            if gpu_stats:
                self.send(GpuReport(gpu_stats))
        core = self.core_ref[0]
        # NOTE: read before the queue, as the receiver thread adds to it: a request counted here
        # is already in the inbox, so the server's "queue + sent since" never misses one (which
        # let admission overshoot its bound by one); one received in between counts twice until
        # the next report, on the safe side.
        num_received = self.num_received
        stats = EngineStats(
            core.is_warm,
            core.num_waiting,
            core.num_waiting_tokens,
            core.num_running,
            core.kv_usage,
            core.num_aborted,
            core.num_preempted,
            core.num_steps,
            num_received,
            core.prefix_cache_stats,
            core.full_step_seconds,
        )
        events = self.observer.events
        if not self.outputs and not events and stats == self.last_stats:
            return
        outputs, self.outputs = self.outputs, []
        self.observer.events = []
        self.last_stats = stats
        self.send(StepReport(outputs, events, stats))

    def send(self, message: FromEngine) -> None:
        # An OSError: the server is gone; the receiver thread sees EOF and stops the loop.
        with contextlib.suppress(OSError):
            self.conn.send(message)


def serve_engine(
    config: EngineConfig,
    requests: Connection,
    messages: Connection,
    init: Callable[[], None] | None = None,
) -> None:
    """The engine process's main function (the target of `multiprocessing.Process`)."""
    faulthandler.enable()  # a native crash leaves its threads' stacks on stderr (the server's)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if config.nice:
        # Before any thread starts: Linux nice values are per thread, and new threads inherit it.
        os.nice(config.nice)
    if init is not None:
        init()  # the server's logging set-up
    try:
        loaded = load_model(config.model)
        config = resolve_engine_config(config, loaded)
    except Exception as exc:
        log.exception("could not load the model")
        messages.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
        return
    messages.send(
        Loaded(
            list(loaded.tokenizer.eos_token_ids),
            config.scheduler,
            pickle.dumps(loaded.tokenizer.hf, protocol=pickle.HIGHEST_PROTOCOL),
        )
    )
    observer = RecordingObserver()
    core_ref: list[EngineCore] = []
    outbox = _Outbox(messages, core_ref, observer)
    core = EngineCore(loaded, config.scheduler, outbox.publish, observer=observer, on_iteration=outbox.flush)
    core_ref.append(core)
    receiver = threading.Thread(target=_receive, args=(requests, core, outbox), name="surge-engine-inbox", daemon=True)
    receiver.start()
    core.run()
    outbox.flush()  # the errors of requests failed on the way out
    if core.dead is not None:
        outbox.send(Died(ENGINE_STOPPED))  # the exception is in this process's log


def _receive(requests: Connection, core: EngineCore, outbox: _Outbox) -> None:
    """Feed the core's inbox from the pipe; a closed pipe means the server is gone: stop."""
    try:
        while True:
            message = requests.recv()
            if isinstance(message, AddRequests):
                for request in message.requests:
                    try:
                        core.add_request(
                            request.request_id,
                            request.prompt_token_ids,
                            request.params,
                            request.priority,
                            request.arrival_time,
                            share=request.share,
                            tier=request.tier,
                            user=request.user,
                        )
                    except Exception as exc:  # the loop died; the server fails the request on Died
                        log.warning("request %s refused: %s", request.request_id, exc)
                    outbox.num_received += 1  # after the inbox holds it: num_waiting never dips
            elif isinstance(message, AbortRequest):
                core.abort_request(message.request_id)
            else:  # StopEngine
                break
    except (EOFError, OSError):
        log.info("the server closed the engine's pipe; stopping")
    core.stop(timeout=0)
