"""Concurrent requests per API key: one key's burst cannot take every place in the queue.

A pure ASGI layer on the generation routes: a key with its limit of requests in flight (from the
request's arrival until its response has ended, streams included) gets a 429 with Retry-After
for the next one, before its body is read. The limit is the key's `max_concurrent` in the keys
file, else `--max-concurrent-per-key`; 0 is no limit. Requests without a key (auth off) are one
tenant and are not limited here: the queue bound is theirs. Counted per replica: N replicas let a
key run N x its limit at most.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from middleware.errors import error_json, send_error

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")


@dataclass(slots=True)
class ConcurrencyCounts:
    num_limited: int = 0  # 429s given


class ConcurrencyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        default_limit: int,
        key_limits: Mapping[str, int] | None = None,
        counts: ConcurrencyCounts | None = None,
        paths: Collection[str] = GENERATION_PATHS,
    ) -> None:
        self.app = app
        self._default = default_limit
        self._limits = dict(key_limits or {})
        self._paths = frozenset(paths)
        self.counts = counts if counts is not None else ConcurrencyCounts()
        self._in_flight: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key: str | None = scope.get("state", {}).get("api_key") if scope["type"] == "http" else None
        if key is None or scope["path"] not in self._paths or not (limit := self._limits.get(key, self._default)):
            await self.app(scope, receive, send)
            return
        in_flight = self._in_flight.get(key, 0)
        if in_flight >= limit:
            self.counts.num_limited += 1
            message = f"This API key already has {in_flight} requests in flight, its limit; retry when one ends."
            body = error_json(message, type="requests", code="rate_limit_exceeded")
            await send_error(send, 429, body, headers=[("retry-after", "1")])
            return
        self._in_flight[key] = in_flight + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self._in_flight[key] - 1
            if left:
                self._in_flight[key] = left
            else:
                del self._in_flight[key]
