"""Concurrent sequences per API key: one key's fan-out cannot take every place in the queue.

A key's limit counts sequences (each choice of each prompt: prompts x n), from the request's
arrival until its response has ended, streams included. Two checks, since the number is known only
once the body is parsed:
- at the door (`ConcurrencyMiddleware`, a pure ASGI layer on the generation routes), before the
  body is read: a key already at its limit gets a 429 with Retry-After; else the request holds one
  place;
- after parse (`ConcurrencyLayer`), the request's place grows to its sequences: past the key's
  limit a 429 with Retry-After that names the numbers; a request larger than the whole limit a 429
  without Retry-After (waiting cannot help; as the tokens bucket's "Request too large").
The limit is the key's `max_concurrent` in the keys file, else `--max-concurrent-per-key`; 0 is
no limit. Requests without a key (auth off) are one tenant and are not limited here: the queue
bound is theirs. Counted per replica: N replicas let a key run N x its limit at most. A key's own
limit is that of the key set its request was authenticated against (`scope["state"]["key_set"]`,
middleware/key_ring.py), else `key_limits`; a key's count is dropped when it reaches 0, so a key
removed from the keys file leaves nothing behind once its requests end.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from middleware.errors import OpenAIError, error_json, send_error
from middleware.generation import MODEL_PATHS, Generation, Handler
from middleware.key_ring import KeySet
from models import OutputSource

LEASE_STATE = "concurrency_lease"  # scope["state"] key of a limited request's `KeyLease`


@dataclass(slots=True)
class ConcurrencyCounts:
    num_limited: int = 0  # 429s given


class KeyLease:
    """A request's places in its key's count: one from arrival, its sequences once they are known."""

    def __init__(self, in_flight: dict[str, int], key: str, limit: int, counts: ConcurrencyCounts) -> None:
        self._in_flight = in_flight
        self._key = key
        self.limit = limit
        self._counts = counts
        self.num_held = 1
        in_flight[key] = in_flight.get(key, 0) + 1

    def take(self, num_sequences: int) -> None:
        """Hold `num_sequences` places instead of what this request holds; a 429 if they do not fit."""
        limit = self.limit
        num_others = self._in_flight.get(self._key, 0) - self.num_held
        if num_sequences > limit:
            self._counts.num_limited += 1
            raise _limited(
                f"This request has {num_sequences} sequences (prompts x n), more than this API key's limit of "
                f"{limit} in flight; send fewer prompts or a smaller n.",
                retry=False,
            )
        if num_others + num_sequences > limit:
            self._counts.num_limited += 1
            raise _limited(
                f"This API key already has {num_others} sequences in flight and this request adds "
                f"{num_sequences}; its limit is {limit}. Retry when some of them end.",
                retry=True,
            )
        self._in_flight[self._key] = num_others + num_sequences
        self.num_held = num_sequences

    def outlive_response(self) -> Callable[[], None]:
        """For work that goes on after its response has ended (the Responses API's background
        runs): its places stay held until the returned function is called, not the response's end."""
        handed = copy.copy(self)  # the same count of the same key
        self.num_held = 0  # the response's own release frees nothing now
        return handed.release

    def release(self) -> None:
        left = self._in_flight.get(self._key, 0) - self.num_held  # a handed-over run may have ended first
        self.num_held = 0
        if left > 0:
            self._in_flight[self._key] = left
        else:
            self._in_flight.pop(self._key, None)


def _limited(message: str, retry: bool) -> OpenAIError:
    headers = {"retry-after": "1"} if retry else {}
    return OpenAIError(message, status_code=429, type="requests", code="rate_limit_exceeded", headers=headers)


class ConcurrencyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        default_limit: int,
        key_limits: Mapping[str, int] | None = None,
        counts: ConcurrencyCounts | None = None,
        paths: Collection[str] = MODEL_PATHS,
    ) -> None:
        self.app = app
        self._default = default_limit
        self._limits = dict(key_limits or {})
        self._paths = frozenset(paths)
        self.counts = counts if counts is not None else ConcurrencyCounts()
        self._in_flight: dict[str, int] = {}  # sequences per key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state", {}) if scope["type"] == "http" else {}
        key: str | None = state.get("api_key")
        keys: KeySet | None = state.get("key_set")
        key_limits = self._limits if keys is None else keys.concurrency_limits
        if key is None or scope["path"] not in self._paths or not (limit := key_limits.get(key, self._default)):
            await self.app(scope, receive, send)
            return
        in_flight = self._in_flight.get(key, 0)
        if in_flight >= limit:
            self.counts.num_limited += 1
            message = f"This API key already has {in_flight} sequences in flight, its limit; retry when one ends."
            body = error_json(message, type="requests", code="rate_limit_exceeded")
            await send_error(send, 429, body, headers=[("retry-after", "1")])
            return
        lease = KeyLease(self._in_flight, key, limit, self.counts)
        scope["state"][LEASE_STATE] = lease
        try:
            await self.app(scope, receive, send)
        finally:
            lease.release()


class ConcurrencyLayer:
    """After parse: the request's place in its key's count grows to its sequences (or a 429)."""

    async def __call__(self, generation: Generation, call_next: Handler) -> OutputSource:
        lease: KeyLease | None = generation.scope.get("state", {}).get(LEASE_STATE)
        if lease is not None:
            lease.take(generation.num_sequences)
        return await call_next(generation)
