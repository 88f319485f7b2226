"""Work that outlives its request: the Responses API's `background: true` runs, on this replica.

Each run is a task keyed by (tenant, response id), so only its own tenant can cancel it. A run's
engine requests hold their slots as any request's do, and the run keeps its key's concurrency
places until it ends (`on_end`), so the traffic layers bound how many a tenant runs at once; this
registry only finds and stops them. At
shutdown the runs still going are cancelled (each records itself as failed: app/responses/background.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

Key = tuple[str, str]  # (tenant, response id)


class BackgroundRuns:
    def __init__(self) -> None:
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._cancelled: set[Key] = set()  # by their client, not by a shutdown

    def __len__(self) -> int:
        return len(self._tasks)

    def start(
        self,
        tenant: str,
        response_id: str,
        work: Coroutine[Any, Any, None],
        on_end: Callable[[], None] | None = None,
    ) -> None:
        """Run `work`; `on_end` once it has ended, however (the key's concurrency places)."""
        key = (tenant, response_id)
        task = asyncio.ensure_future(work)
        self._tasks[key] = task

        def finished(_: asyncio.Task[None]) -> None:
            self._finished(key)
            if on_end is not None:
                on_end()

        task.add_done_callback(finished)

    def cancel(self, tenant: str, response_id: str) -> bool:
        """Stop the run if it goes on here; False when this replica does not run it (any more)."""
        key = (tenant, response_id)
        task = self._tasks.get(key)
        if task is None or task.done():
            return False
        self._cancelled.add(key)
        task.cancel()
        return True

    def was_cancelled(self, tenant: str, response_id: str) -> bool:
        """Whether the run's client cancelled it (else a cancellation is the server's own)."""
        return (tenant, response_id) in self._cancelled

    async def aclose(self) -> None:
        """Cancel every run still going and wait for each to record how it ended."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _finished(self, key: Key) -> None:
        self._tasks.pop(key, None)
        self._cancelled.discard(key)
