"""The keys file reloaded while the server runs: on SIGHUP, and when it changes on disk.

A poll every `--keys-file-reload-seconds` (0: none) asks the watcher (middleware/key_ring.py) to
reload a file that is not the one loaded last; SIGHUP reloads it whatever it is. Both read the
file on a worker thread, never on the event loop. SIGHUP is taken only on the main thread (where
`surge serve` runs its loop; uvicorn takes SIGINT and SIGTERM there, not SIGHUP), through the
loop, so the handler runs as a callback rather than between two bytecodes of a request; without a
keys file SIGHUP keeps its default action.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from middleware.key_ring import KeysFileWatcher

log = logging.getLogger("surge.keys")


@asynccontextmanager
async def reloading_keys(watcher: KeysFileWatcher | None, interval_seconds: float) -> AsyncIterator[None]:
    """While inside, `watcher` reloads on SIGHUP and (interval > 0) when the file changes."""
    if watcher is None:
        yield
        return
    tasks: set[asyncio.Task[None]] = set()

    def start(reload: Callable[[], bool]) -> None:
        task = asyncio.create_task(_run(reload))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    loop = asyncio.get_running_loop()
    on_sighup = threading.current_thread() is threading.main_thread()
    if on_sighup:
        loop.add_signal_handler(signal.SIGHUP, start, watcher.reload)
    poller = asyncio.create_task(_poll(watcher, interval_seconds)) if interval_seconds > 0 else None
    try:
        yield
    finally:
        if on_sighup:
            loop.remove_signal_handler(signal.SIGHUP)
        for task in [*tasks, *([poller] if poller is not None else [])]:
            task.cancel()


async def _poll(watcher: KeysFileWatcher, interval_seconds: float) -> None:
    while True:
        await asyncio.sleep(interval_seconds)
        await _run(watcher.check)


async def _run(reload: Callable[[], bool]) -> None:
    try:
        await asyncio.to_thread(reload)
    except Exception:
        # The watcher reports the file's own problems; anything else is a bug, logged, and the
        # next poll or signal tries again: the keys in use stay as they were.
        log.exception("reloading the keys file failed")
