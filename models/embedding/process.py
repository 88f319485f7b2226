"""The embedding model in a process of its own, and `start_embeddings`, which picks it or a thread.

Why a process: with the chat engines in their own processes the server's process never imports
torch (hundreds of MiB, seconds of start-up, and the garbage collector's walks over its objects);
the encoder brings torch, so it runs beside them as they do. The child loads the encoder, sends
back its shape and its tokenizer (pickled: the server tokenizes texts itself, as it does for
chat), then runs the same batching loop (batcher.py) on whatever arrives. Vectors come back as
float32 bytes. With `--engine-mode thread` the loop runs on a thread of the server instead.

Messages are plain tuples, one per `send`:
- server -> child: ("embed", job, inputs, dimensions), ("cancel", job), ("stop",);
- child -> server: ("loaded", info, tokenizer) or ("failed", message) once, then ("done", job,
  vectors, stats) or ("error", job, full, message, stats) per job.
A closed pipe ends the child (the server is gone) and fails every waiting job on the server's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import functools
import itertools
import logging
import multiprocessing
import pickle
import signal
import threading
from array import array
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from models.embedding.info import Embedder, EmbeddingQueueFull, EmbeddingStats, EncoderInfo, vector_of
from models.runner.cpus import bound_onednn_caches

log = logging.getLogger("surge.embedding")


async def start_embeddings(
    model: str,
    *,
    device: str = "auto",
    threads: int = 1,
    attempts: int = 5,
    separate_process: bool = True,
    init: Callable[[], None] | None = None,
) -> Embedder:
    """The embedding model loaded and its batching loop running: in a child process, or on a thread
    here. `init` runs first in the child (the server's logging set-up); it must pickle."""
    if not separate_process:
        from models.embedding.batcher import EmbeddingEngine
        from models.embedding.encoder import Encoder

        encoder = await asyncio.to_thread(Encoder.load, model, device=device, attempts=attempts)
        return EmbeddingEngine(encoder, threads=threads)
    ctx = multiprocessing.get_context("spawn")
    requests_out, requests_in = ctx.Pipe(duplex=False)
    results_in, results_out = ctx.Pipe(duplex=False)
    args = (model, device, threads, attempts, requests_out, results_out, init)
    process = ctx.Process(target=_main, args=args, name="surge-embedding", daemon=True)
    process.start()
    requests_out.close()
    results_out.close()
    try:
        first = await asyncio.to_thread(_first_message, results_in)
    except BaseException:
        process.kill()
        raise
    if first[0] != "loaded":
        process.join(timeout=5)
        raise RuntimeError(f"the embedding model could not load: {first[1]}")
    tokenizer = await asyncio.to_thread(pickle.loads, first[2])
    return EmbeddingProcess(process, requests_in, results_in, first[1], tokenizer, asyncio.get_running_loop())


def _first_message(results: Connection) -> tuple[Any, ...]:
    try:
        message: tuple[Any, ...] = results.recv()
    except EOFError:
        return ("failed", "the embedding process ended while loading (its log says why)")
    return message


class EmbeddingProcess:
    """The server's side of the embedding process (an `Embedder`)."""

    def __init__(
        self,
        process: BaseProcess,
        requests: Connection,
        results: Connection,
        info: EncoderInfo,
        tokenizer: Any,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._process = process
        self._requests = requests
        self._results = results
        self._info = info
        self._tokenizer = tokenizer
        self._loop = loop
        self._stats = EmbeddingStats()
        self._pending: dict[int, tuple[asyncio.Future[list[array[float]]], int]] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._waiting_tokens = 0
        self._reader = threading.Thread(target=self._read, name="surge-embedding-results", daemon=True)
        self._reader.start()

    @property
    def info(self) -> EncoderInfo:
        return self._info

    @property
    def stats(self) -> EmbeddingStats:
        return self._stats

    @property
    def is_alive(self) -> bool:
        return self._reader.is_alive()

    @property
    def num_waiting_tokens(self) -> int:
        return self._waiting_tokens

    def encode_text(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"]
        return ids

    async def embed(self, inputs: list[list[int]], dimensions: int | None = None) -> list[array[float]]:
        if not self._reader.is_alive():
            raise RuntimeError("the embedding process has ended")
        job = next(self._ids)
        future: asyncio.Future[list[array[float]]] = self._loop.create_future()
        num_tokens = sum(len(ids) for ids in inputs)
        self._pending[job] = (future, num_tokens)
        self._waiting_tokens += num_tokens
        try:
            self._send(("embed", job, inputs, dimensions))
            return await future
        finally:
            if self._pending.pop(job, None) is not None:
                self._waiting_tokens -= num_tokens
                if not future.done():  # the caller gave up: the child drops the job if it has not started
                    self._send(("cancel", job))

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._send(("stop",))
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
        self._reader.join(timeout=5)

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._requests.send(message)

    def _read(self) -> None:
        while True:
            try:
                message = self._results.recv()
            except (EOFError, OSError):
                break
            self._loop.call_soon_threadsafe(self._settle, message)
        self._loop.call_soon_threadsafe(self._fail_all)

    def _settle(self, message: tuple[Any, ...]) -> None:
        entry = self._pending.get(message[1])
        self._stats = message[-1]
        if entry is None or entry[0].done():
            return
        if message[0] == "done":
            entry[0].set_result([vector_of(raw) for raw in message[2]])
        elif message[2]:  # the child's queue was full
            entry[0].set_exception(EmbeddingQueueFull(message[3]))
        else:
            entry[0].set_exception(RuntimeError(message[3]))

    def _fail_all(self) -> None:
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(RuntimeError("the embedding process has ended"))


def _main(
    model: str,
    device: str,
    threads: int,
    attempts: int,
    requests: Connection,
    results: Connection,
    init: Callable[[], None] | None,
) -> None:
    bound_onednn_caches()  # before torch is imported (models/runner/cpus.py)
    faulthandler.enable()  # a native crash leaves its threads' stacks on stderr (the server's)
    # The server stops it (a "stop", or its pipe closing), never a signal meant for the server.
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    if init is not None:
        init()
    from models.embedding.batcher import EmbeddingEngine
    from models.embedding.encoder import Encoder

    try:
        encoder = Encoder.load(model, device=device, attempts=attempts)
    except Exception as exc:
        log.exception("could not load the embedding model")
        results.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    engine = EmbeddingEngine(encoder, threads=threads)
    results.send(("loaded", encoder.info, pickle.dumps(encoder.tokenizer, protocol=pickle.HIGHEST_PROTOCOL)))
    lock = threading.Lock()
    running: dict[int, Future[list[array[float]]]] = {}

    def reply(job: int, future: Future[list[array[float]]]) -> None:
        running.pop(job, None)
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            message: tuple[Any, ...] = ("done", job, [vector.tobytes() for vector in future.result()], engine.stats)
        else:
            message = ("error", job, isinstance(error, EmbeddingQueueFull), str(error), engine.stats)
        with lock:
            results.send(message)

    try:
        while True:
            message = requests.recv()
            if message[0] == "embed":
                job = message[1]
                try:
                    future = engine.submit(message[2], message[3])
                except EmbeddingQueueFull as exc:
                    with lock:
                        results.send(("error", job, True, str(exc), engine.stats))
                    continue
                running[job] = future
                future.add_done_callback(functools.partial(reply, job))
            elif message[0] == "cancel" and (started := running.get(message[1])) is not None:
                started.cancel()
            elif message[0] == "stop":
                break
    except (EOFError, OSError):
        pass  # the server is gone
    finally:
        engine.stop()
