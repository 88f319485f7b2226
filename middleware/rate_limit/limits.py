"""Rate limits per caller: the limits, the 429, and one request's view of its caller's buckets.

A caller has two token buckets (middleware/rate_limit/buckets.py): requests per minute, taken at
the door (middleware/rate_limit/asgi.py), and tokens per minute, reserved once the request's cost
is known (middleware/rate_limit/tokens.py). `RequestLimits` is what one request holds of both, in
`scope["state"]["rate_limits"]`; a `TokenReservation` is the tokens it took, settled (the unused
part refunded) when the request ends.

Headers follow OpenAI: `x-ratelimit-limit-*`, `-remaining-*` (whole tokens) and `-reset-*` (time
until the bucket is full again, as a Go duration: `120ms`, `1.5s`, `1m0s`), for the limits that
are on. Must not know `app/` or the engine.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

from middleware.errors import error_json
from middleware.keys_file import Limits
from middleware.rate_limit.buckets import Decision, TokenBuckets

log = logging.getLogger("surge.rate_limit")

_LABELS = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}


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
