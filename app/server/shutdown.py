"""Graceful shutdown for Kubernetes: uvicorn's Server with a drain window in front.

Owns the signal handling of `surge serve`. The sequence on SIGTERM (or SIGINT):
1. at once, `state.is_shutting_down = True`: `/ready` answers 503 and new requests get a 503
   with `Retry-After` and `Connection: close` (middleware/edge/draining.py), while the listener
   stays open, because Kubernetes keeps sending traffic until the endpoint is removed;
2. after `--shutdown-delay-seconds`, uvicorn's own shutdown: the listener closes, idle
   connections close, and in-flight requests (streams included) run to the end, for at most
   `--shutdown-grace-seconds` (uvicorn's `timeout_graceful_shutdown`);
3. the lifespan stops the engine and the process exits 0.
A second signal forces the exit at once.

NOTE: uvicorn re-raises a captured signal after a graceful shutdown (so the default handler
would kill the process with status 143); this server does not record the signal, so an orderly
shutdown returns normally and the process exits 0.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

log = logging.getLogger("surge.shutdown")

# Exit status of a forced exit on a second signal, as a shell reports a signal death.
FORCED_EXIT_STATUS = 128 + signal.SIGTERM


class DrainingServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        *,
        on_shutdown_signal: Callable[[], None],
        delay_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(config)
        self.on_shutdown_signal = on_shutdown_signal
        self.delay_seconds = delay_seconds
        self.clock = clock
        self.exit_at: float | None = None  # when the listener closes; None until a signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in the main thread (the event loop's) between bytecodes: only set plain attributes
        # here; the loop's 0.1 s tick (on_tick) acts on them.
        if self.exit_at is not None:
            log.warning("second %s: exiting now, cutting in-flight requests", signal.Signals(sig).name)
            os._exit(FORCED_EXIT_STATUS)
        self.exit_at = self.clock() + self.delay_seconds
        self.on_shutdown_signal()
        log.info(
            "%s: not ready; refusing new requests for %.1f s, then draining in-flight ones for up to %.0f s",
            signal.Signals(sig).name,
            self.delay_seconds,
            self.config.timeout_graceful_shutdown or 0,
        )

    async def on_tick(self, counter: int) -> bool:
        if self.exit_at is not None and not self.should_exit and self.clock() >= self.exit_at:
            log.info("closing the listener; waiting for in-flight requests")
            self.should_exit = True
        return await super().on_tick(counter)
