"""The engine loop's inbox: requests, aborts and the stop, from any thread to the loop's.

Requests whose grammar still compiles wait in the intake (models/engine/intake.py) and reach the
queue when ready; they count as in the inbox from the moment they are added, so the engine's
`num_waiting` (and /metrics, and admission) never misses one.
"""

from __future__ import annotations

import queue

from models.engine.intake import GrammarIntake
from models.engine.request import EngineRequest
from models.grammar.compiler import GrammarCompiler


class Stop:
    """The inbox's last item: leave the loop."""


class Inbox:
    def __init__(self, grammars: GrammarCompiler) -> None:
        self._queue: queue.SimpleQueue[EngineRequest | str | Stop] = queue.SimpleQueue()
        self._intake = GrammarIntake(grammars, self._queue.put)
        # Requests (not aborts) added and taken: each counter has one writer (the adding thread;
        # the loop), so their difference is exact without a lock.
        self._added = 0
        self._taken = 0

    # --- from any thread ---------------------------------------------------------------------

    def add(self, request: EngineRequest) -> None:
        self._added += 1  # before the put: counted early rather than missed
        self._intake.add(request)

    def abort(self, request_id: str) -> None:
        self._queue.put(request_id)

    def stop(self) -> None:
        self._queue.put(Stop())

    @property
    def num_requests(self) -> int:
        """Requests added and not yet taken by the loop (compiling ones included).

        NOTE: not the queue's size, which also counts aborts (a client that went away showed as
        one more request waiting, over --max-queued-requests on /metrics)."""
        return self._added - self._taken

    # --- on the loop's thread ----------------------------------------------------------------

    def get(self, block: bool, timeout: float | None) -> EngineRequest | str | Stop | None:
        """The next request, abort (a request id) or stop; None when there is none, after waiting
        up to `timeout` seconds (None: as long as it takes) when `block`. A request aborted while
        its grammar compiled is taken here and never returned."""
        while True:
            try:
                item = self._queue.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return None
            if isinstance(item, EngineRequest) and not self._intake.arrived(item):
                self._taken += 1
                block = False
                continue
            return item

    def taken(self) -> None:
        """A request from `get` is answered, or counted by the scheduler now: no longer here."""
        self._taken += 1

    def abort_compiling(self, request_id: str) -> bool:
        """Whether `request_id` is still compiling: then it is dropped when it arrives."""
        return self._intake.abort(request_id)

    def drain(self) -> list[EngineRequest]:
        """Every request still queued or compiling (the loop is stopping), taken, to be failed."""
        requests = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, EngineRequest):
                self._taken += 1
                if self._intake.arrived(item):
                    requests.append(item)
        compiling = self._intake.drain()  # after the queue: one arriving meanwhile is in this list
        self._taken += len(compiling)
        return requests + compiling
