"""Rate limits per caller: the requests bucket at the door, the tokens bucket at admission.

Owns the rules and the HTTP face of the token buckets (`middleware/token_bucket.py`):

- `RateLimitMiddleware` (pure ASGI), on the POST generation endpoints only, takes 1 from the
  caller's requests-per-minute bucket (empty: 429 of type `requests`), puts a `RequestLimits`
  in `scope["state"]["rate_limits"]` and adds the `x-ratelimit-*` headers to every response.
  Headers are added at `http.response.start` only; body messages pass untouched, so a stream
  costs nothing extra.
- The token cost (prompt + max_tokens) is known only once the app has parsed and tokenized the
  request, so the app reserves it with `reserve_tokens(scope, cost)` (over the limit:
  `RateLimitExceeded` of type `tokens`, which the app turns into the same 429) and settles the
  reservation when the request ends, however it ends: the unused part goes back to the bucket.

The caller is its API key (which `middleware/auth.py` puts in `scope["state"]`), or its client
address when no keys are configured. Bucket names carry a hash of the key, never the key.

Headers follow OpenAI: `x-ratelimit-limit-*`, `-remaining-*` (whole tokens) and `-reset-*` (time
until the bucket is full again, as a Go duration: `120ms`, `1.5s`, `1m0s`), for the limits that
are on. Must not know `app/` or `models/`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from middleware._errors import error_json, send_error
from middleware.keys_file import KeysFile
from middleware.token_bucket import Decision, TokenBuckets

log = logging.getLogger("surge.rate_limit")

RATE_LIMITED_PATHS = ("/v1/chat/completions", "/v1/completions")
_LABELS = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int = 0  # requests per minute; 0 = unlimited
    tpm: int = 0  # tokens (prompt + max_tokens) per minute; 0 = unlimited

    def __post_init__(self) -> None:
        if self.rpm < 0 or self.tpm < 0:
            raise ValueError("rate limits must be 0 (unlimited) or positive")

    @property
    def is_limited(self) -> bool:
        return self.rpm > 0 or self.tpm > 0


def per_key_limits(keys: KeysFile, default: Limits) -> dict[str, Limits]:
    """Each key's limits: its own `rpm` / `tpm` where the keys file gives them, else `default`."""
    return {
        entry.key: Limits(
            default.rpm if entry.rpm is None else entry.rpm, default.tpm if entry.tpm is None else entry.tpm
        )
        for entry in keys.entries
    }


@dataclass(slots=True)
class RateLimitCounts:
    """429s given so far, by bucket; the app's metrics read them (this layer exports nothing)."""

    num_limited_requests: int = 0
    num_limited_tokens: int = 0


class RateLimitExceeded(Exception):
    """Over a limit; rendered as OpenAI's 429 (`type` requests or tokens, `rate_limit_exceeded`)."""

    def __init__(self, kind: str, decision: Decision, cost: int) -> None:
        self.kind = kind
        self.decision = decision
        label, limit = _LABELS[kind], decision.capacity
        if math.isinf(decision.retry_after):
            self.message = (
                f"Request too large for {label}: Limit {limit}, Requested {cost}. "
                "The input or output tokens must be reduced in order to run successfully."
            )
        else:
            self.message = (
                f"Rate limit reached for {label}: Limit {limit}, Used {limit - decision.remaining}, "
                f"Requested {cost}. Please try again in {go_duration(decision.retry_after)}."
            )
        super().__init__(self.message)

    @property
    def headers(self) -> dict[str, str]:
        """Retry-After (whole seconds, rounded up) and retry-after-ms; none when a retry cannot help."""
        wait = self.decision.retry_after
        if math.isinf(wait):
            return {}
        return {"retry-after": str(max(1, math.ceil(wait))), "retry-after-ms": str(max(1, math.ceil(wait * 1000)))}

    def body(self) -> bytes:
        return error_json(self.message, type=self.kind, code="rate_limit_exceeded")


class TokenReservation:
    """Tokens taken from the caller's bucket at admission; `settle` gives back the unused part."""

    def __init__(self, cost: int, limits: RequestLimits | None = None) -> None:
        self.cost = cost
        self._limits = limits
        self.is_settled = False

    @property
    def is_refundable(self) -> bool:
        """False when no bucket was touched (tokens unlimited) or it was settled already."""
        return self._limits is not None and not self.is_settled

    async def settle(self, num_used_tokens: int) -> None:
        """Refund `cost - num_used_tokens`; only the first call counts.

        Safe in a `finally` of a cancelled task (a client that went away): the refund runs as
        its own task, so it completes even when this await is cancelled.
        """
        if self.is_settled:
            return
        self.is_settled = True
        unused = self.cost - num_used_tokens
        if unused > 0 and self._limits is not None:
            await self._limits.refund_tokens(unused)

    @asynccontextmanager
    async def settle_on_exit(self, num_used_tokens: Callable[[], int]) -> AsyncIterator[None]:
        """Settle with `num_used_tokens()` when the block ends, however it ends."""
        try:
            yield
        finally:
            await self.settle(num_used_tokens())


class RequestLimits:
    """One request's view of its caller's two buckets; the app reaches it through scope state."""

    def __init__(
        self,
        buckets: TokenBuckets,
        identity: str,
        limits: Limits,
        tasks: set[asyncio.Task[None]],
        counts: RateLimitCounts | None = None,
    ) -> None:
        self._buckets = buckets
        self._counts = counts if counts is not None else RateLimitCounts()
        self._identity = identity
        self.limits = limits
        self._tasks = tasks  # owned by the middleware, so refunds outlive the request
        self.requests: Decision | None = None  # the latest decision of each bucket, for headers
        self.tokens: Decision | None = None

    async def take_request(self) -> Decision:
        self.requests = await self._buckets.take("requests:" + self._identity, self.limits.rpm, 1)
        return self.requests

    async def reserve_tokens(self, cost: int) -> TokenReservation:
        """Take `cost` tokens, or raise RateLimitExceeded (type `tokens`) and take nothing."""
        if not self.limits.tpm:
            return TokenReservation(cost)
        self.tokens = await self._take_tokens(cost)
        if not self.tokens.is_allowed:
            self._counts.num_limited_tokens += 1
            raise RateLimitExceeded("tokens", self.tokens, cost)
        return TokenReservation(cost, self)

    async def refund_tokens(self, amount: int) -> None:
        task = asyncio.ensure_future(self._refund(amount))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.shield(task)

    async def _refund(self, amount: int) -> None:
        try:
            self.tokens = await self._take_tokens(-amount)
        except Exception:  # a refund is best effort; never fail the response over it
            log.exception("could not refund %d tokens", amount)

    async def _take_tokens(self, cost: int) -> Decision:
        return await self._buckets.take("tokens:" + self._identity, self.limits.tpm, cost)

    async def headers(self) -> list[tuple[str, str]]:
        headers: list[tuple[str, str]] = []
        if self.limits.rpm:
            requests = self.requests or await self._buckets.take("requests:" + self._identity, self.limits.rpm, 0)
            headers += _headers("requests", requests)
        if self.limits.tpm:
            # No reservation yet (the request failed before it, or was a 429): read the bucket.
            headers += _headers("tokens", self.tokens or await self._take_tokens(0))
        return headers


def request_limits(scope: Scope) -> RequestLimits | None:
    limits: RequestLimits | None = scope.get("state", {}).get("rate_limits")
    return limits


async def reserve_tokens(scope: Scope, cost: int) -> TokenReservation:
    """The app's entry point: reserve `cost` tokens for this request (a no-op when unlimited)."""
    limits = request_limits(scope)
    if limits is None:
        return TokenReservation(cost)
    return await limits.reserve_tokens(cost)


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
        limits = self._limits if api_key is None else self._key_limits.get(api_key, self._limits)
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


def _headers(kind: str, decision: Decision) -> list[tuple[str, str]]:
    return [
        (f"x-ratelimit-limit-{kind}", str(decision.capacity)),
        (f"x-ratelimit-remaining-{kind}", str(decision.remaining)),
        (f"x-ratelimit-reset-{kind}", go_duration(decision.reset_after)),
    ]


def go_duration(seconds: float) -> str:
    """A duration as Go prints one (and so OpenAI's reset headers), to the millisecond, rounded
    up: `0s`, `120ms`, `1s`, `1.5s`, `1m0s`, `6m0s`, `1h2m3.5s`."""
    ms = math.ceil(round(seconds * 1000, 6))
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, ms = divmod(ms, 60_000)
    hours, minutes = divmod(minutes, 60)
    whole, fraction = divmod(ms, 1000)
    text = f"{whole}.{fraction:03d}".rstrip("0") if fraction else str(whole)
    if hours:
        return f"{hours}h{minutes}m{text}s"
    if minutes:
        return f"{minutes}m{text}s"
    return f"{text}s"
