"""Starting the engine's child process, from a module that imports neither torch nor transformers.

Why its own module: `surge serve` starts the child first thing, before the server imports its
own half (FastAPI, the tokenizer, transformers and with it torch: seconds on a small machine),
so the child's imports and model load run beside the server's instead of after them (time to
/ready: docs/engine.md, measurements). A `spawn` child
unpickles its target by module and name, so the target (`_main`) must live where importing it is
cheap in the parent.

The child side is models/process/child.py; the server side, which adopts what is started here,
is models/process/parent.py; what they say to each other, models/process/messages.py.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from models.config import EngineConfig
from models.runner import heap
from models.runner.cpus import bound_onednn_caches


@dataclass(frozen=True, slots=True)
class SpawnedEngine:
    """A started engine child and the server's ends of its two one-way pipes."""

    config: EngineConfig
    process: BaseProcess
    requests: Connection  # server -> child
    messages: Connection  # child -> server


def spawn_engine(config: EngineConfig, init: Callable[[], None] | None = None) -> SpawnedEngine:
    """Start the child now; it loads the model and waits for the server on the pipes.
    `init` runs first in the child (the server's logging set-up); it must pickle."""
    ctx = multiprocessing.get_context("spawn")
    requests_out, requests_in = ctx.Pipe(duplex=False)
    messages_in, messages_out = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_main, args=(config, requests_out, messages_out, init), name="surge-engine", daemon=True
    )
    with heap.child_environment():  # its allocator is chosen as the child starts (models/runner/heap.py)
        process.start()
    # The child's ends, closed here so that EOF reaches each side when the other exits.
    requests_out.close()
    messages_out.close()
    return SpawnedEngine(config, process, requests_in, messages_in)


def _main(config: EngineConfig, requests: Connection, messages: Connection, init: Callable[[], None] | None) -> None:
    bound_onednn_caches()  # before torch is imported (models/runner/cpus.py), whoever started this process
    from models.process.child import serve_engine  # the child's heavy imports, not the parent's

    serve_engine(config, requests, messages, init)
