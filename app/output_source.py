"""What the routes render: the engine's `RequestGroup`, a shared (dedup) generation, a canned
reply, or a metered wrapper of any of them. One protocol, so each layer can wrap another."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol

from models.outputs import RequestOutput


class OutputSource(Protocol):
    """Iterate with `next_outputs` until `finished`; leaving `async with` ends it (for an engine
    request, that aborts what has not finished)."""

    request_ids: list[str]
    index: dict[str, int]

    @property
    def finished(self) -> bool: ...

    async def next_outputs(self, timeout: float | None = None) -> list[RequestOutput]: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
