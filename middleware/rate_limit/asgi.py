"""The requests bucket at the door, as a pure ASGI middleware.

On the POST generation endpoints only: takes 1 from the caller's requests-per-minute bucket
(empty: 429 of type `requests`), puts the request's `RequestLimits` in
`scope["state"]["rate_limits"]` (the tokens bucket is reserved there later, once the cost is
known: middleware/rate_limit/tokens.py) and adds the `x-ratelimit-*` headers to every response.
Headers are added at `http.response.start` only; body messages pass untouched, so a stream costs
nothing extra.

The caller is its API key (which middleware/edge/auth.py puts in `scope["state"]`), or its client
address when no keys are configured. Bucket names carry a hash of the key, never the key. A key's
own limits are those of the key set its request was authenticated against (`scope["state"]
["key_set"]`, middleware/key_ring.py: a reload of the keys file applies from the next request on),
else `key_limits`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Collection, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from middleware.errors import send_error
from middleware.generation import MODEL_PATHS
from middleware.key_ring import KeySet
from middleware.keys_file import Limits
from middleware.rate_limit.buckets import TokenBuckets
from middleware.rate_limit.limits import RateLimitCounts, RateLimitExceeded, RequestLimits

RATE_LIMITED_PATHS = MODEL_PATHS


class RateLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        buckets: TokenBuckets,
        limits: Limits,
        key_limits: Mapping[str, Limits] | None = None,
        paths: Collection[str] = RATE_LIMITED_PATHS,
        counts: RateLimitCounts | None = None,
    ) -> None:
        for value in (limits, *(key_limits or {}).values()):
            if not isinstance(value, Limits):
                raise TypeError("limits must be Limits instances")
        self.app = app
        self._buckets = buckets
        self._limits = limits
        self._key_limits = dict(key_limits or {})
        self._paths = frozenset(paths)
        self._tasks: set[asyncio.Task[None]] = set()
        self.counts = counts if counts is not None else RateLimitCounts()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self._paths:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        api_key: str | None = state.get("api_key")
        keys: KeySet | None = state.get("key_set")
        key_limits = self._key_limits if keys is None else keys.rate_limits
        limits = self._limits if api_key is None else key_limits.get(api_key, self._limits)
        if not limits.is_limited:
            await self.app(scope, receive, send)
            return

        limiter = RequestLimits(self._buckets, _identity(api_key, scope), limits, self._tasks, self.counts)
        if limits.rpm and not (decision := await limiter.take_request()).is_allowed:
            self.counts.num_limited_requests += 1
            exceeded = RateLimitExceeded("requests", decision, 1)
            await send_error(send, 429, exceeded.body(), [*exceeded.headers.items(), *await limiter.headers()])
            return
        state["rate_limits"] = limiter

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in await limiter.headers()]
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _identity(api_key: str | None, scope: Scope) -> str:
    if api_key is not None:
        return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:32]
    client = scope.get("client")
    return "addr:" + (str(client[0]) if client else "unknown")
