"""`background: true`: the Response comes back `queued` at once and is generated on; the client
polls `GET /v1/responses/{id}` and may `POST /v1/responses/{id}/cancel`.

The request is checked, tokenized and admitted before the answer (its errors are HTTP errors, as
for any request); the run then goes on without its connection and stores how it ended:
`completed` or `incomplete`, `failed` with an `error`, or `cancelled` (written by whoever
cancelled); never over a response cancelled or deleted meanwhile. With Redis behind the store, a
cancel that reaches another replica marks the stored response (a delete removes it), and the
replica that runs it looks for either every `CANCEL_POLL_SECONDS` and stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from app.generation.collect import ChoiceResult, collect
from app.runtime.background import BackgroundRuns
from app.runtime.response_storage import ResponseStorage
from middleware.errors import OpenAIError
from models import OutputSource

log = logging.getLogger("surge.responses")

CANCEL_POLL_SECONDS = 0.5
# A run stopped by the server's shutdown, not by its client.
SHUTDOWN_ERROR = {"code": "server_error", "message": "The server shut down before this response finished."}


class _CancelledElsewhere(Exception):
    """Another replica marked the response cancelled (and stored it so)."""


async def run_in_background(
    source: OutputSource,
    runs: BackgroundRuns,
    storage: ResponseStorage,
    tenant: str,
    response_id: str,
    render: Callable[[ChoiceResult], dict[str, Any]],
    fail: Callable[[dict[str, str]], dict[str, Any]],
    keep: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """Generate to the end and `keep` the rendered Response, or the failure `fail` renders."""
    try:
        (result,) = await _collect_unless_cancelled(source, storage, tenant, response_id)
        response = render(result)
    except _CancelledElsewhere:
        return
    except asyncio.CancelledError:
        if not runs.was_cancelled(tenant, response_id):
            await keep(fail(SHUTDOWN_ERROR))
        raise
    except OpenAIError as exc:
        code = "server_error" if exc.status_code >= 500 else "invalid_prompt"
        response = fail({"code": code, "message": exc.message})
    except Exception as exc:  # never lost silently: the client polls for an end
        log.exception("background response %s failed", response_id)
        response = fail({"code": "server_error", "message": f"The server had an error while generating: {exc}"})
    await keep(response)


async def _collect_unless_cancelled(
    source: OutputSource, storage: ResponseStorage, tenant: str, response_id: str
) -> list[ChoiceResult]:
    """`collect(source)`, stopped (its engine requests aborted) when another replica marks the
    response cancelled; the mark's writer stored the cancelled response already."""
    work = asyncio.ensure_future(collect(source))
    try:
        while True:
            done, _ = await asyncio.wait({work}, timeout=CANCEL_POLL_SECONDS if storage.is_shared else None)
            if done:
                return work.result()
            if await storage.is_cancelled(tenant, response_id):
                raise _CancelledElsewhere
    finally:
        work.cancel()
