"""An engine core built and run on one new thread: how an engine in the server's process starts.

Loading on the loop's thread rather than another: torch's OpenMP runtime (libgomp) keeps a team of
worker threads per thread that runs parallel regions, and once a process holds more of them than
CPUs its idle workers sleep between regions instead of spinning, so every op of every step pays a
wake-up. On 2 AVX2 cores, with the model loaded on one thread and the loop on another, a
decode-only step of the tiny `l` at 32 rows took 81 and 73 ms against 69 and 61 ms with both on
one (scripts/bench_engine.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from models.engine.core import EngineCore


def start_on_own_thread(build: Callable[[], EngineCore]) -> Future[EngineCore]:
    """Build a core on a new thread (`build` loads the model) and run its loop there; the future
    holds the core once built, or what `build` raised."""
    built: Future[EngineCore] = Future()

    def main() -> None:
        try:
            core = build()
        except BaseException as exc:  # the caller awaits the future: it must hear of it
            built.set_exception(exc)
            return
        core.adopt_current_thread()
        built.set_result(core)
        core.run()

    threading.Thread(target=main, name="surge-engine", daemon=True).start()
    return built
