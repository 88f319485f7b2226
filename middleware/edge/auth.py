"""API-key authentication as a pure ASGI middleware.

Owns the check of `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) against the
configured keys. Knows nothing of routes or the engine; it hands the authenticated key to later
layers in `scope["state"]`.

Rules, in order:
- non-HTTP scopes (lifespan, websocket) pass straight through;
- with no keys configured, every request passes (auth is off);
- open paths (health, readiness, metrics) and CORS preflights pass unauthenticated;
- anything else needs a configured key, else 401 with OpenAI's error body.

An authenticated request carries its key in `scope["state"]["api_key"]`, its priority tier
(from `--keys-file`, lower = more important) in `scope["state"]["priority_tier"]` when it has one,
and the lowest body priority it may send in `scope["state"]["min_priority"]` when that is below 0.

The keys are fixed (`api_keys`, ...) or a `KeyRing` whose set a reload of the keys file replaces
(middleware/key_ring.py): each request reads the set in force once, so a removed key is refused
from the next request on, and an authenticated request carries that set in
`scope["state"]["key_set"]`, so the later per-key layers (rate limit, concurrency) go by the same
one whatever a reload does meanwhile.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Collection, Mapping, Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from middleware.edge.auth_failures import AuthFailures
from middleware.errors import error_json, send_error
from middleware.key_ring import KeyRing, KeySet

DEFAULT_OPEN_PATHS = ("/health", "/ready", "/metrics")

_MISSING_KEY_MESSAGE = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
# NOTE: unlike OpenAI we do not echo a masked key back; a wrong key is still a secret.
_WRONG_KEY_MESSAGE = "Incorrect API key provided."


class ApiKeyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        api_keys: Sequence[str] = (),
        open_paths: Collection[str] = DEFAULT_OPEN_PATHS,
        priority_tiers: Mapping[str, int] | None = None,
        min_priorities: Mapping[str, int] | None = None,
        failures: AuthFailures | None = None,
        ring: KeyRing | None = None,
    ) -> None:
        """failures: where failed attempts are counted and throttled per client address; ring: the
        keys in force, instead of `api_keys`, `priority_tiers` and `min_priorities`."""
        if ring is None:
            ring = KeyRing(KeySet.of(api_keys, priority_tiers, min_priorities))
        elif api_keys or priority_tiers or min_priorities:
            raise ValueError("give the keys or a key ring, not both")
        self.app = app
        self._ring = ring
        self._open_paths = frozenset(open_paths)
        self._failures = failures if failures is not None else AuthFailures(0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys = self._ring.current  # once: this request sees one set, whatever a reload does meanwhile
        if scope["type"] != "http" or not keys.keys or self._is_exempt(scope):
            await self.app(scope, receive, send)
            return

        presented = _bearer_token(scope)
        matched = _match(keys.keys, presented) if presented is not None else None
        if matched is None:
            address = (scope.get("client") or ("unknown", 0))[0]
            failures = self._failures
            if not failures.allows_attempt(address):
                await _throttle(send, failures.retry_after(address))
                return
            failures.failed(address)
            await _reject(send, _MISSING_KEY_MESSAGE if presented is None else _WRONG_KEY_MESSAGE)
            return
        state = scope.setdefault("state", {})
        state["api_key"] = matched.decode()
        state["key_set"] = keys
        if (tier := keys.tiers.get(matched)) is not None:
            state["priority_tier"] = tier
        if (floor := keys.min_priorities.get(matched)) is not None:
            state["min_priority"] = floor
        await self.app(scope, receive, send)

    def _is_exempt(self, scope: Scope) -> bool:
        if scope["path"] in self._open_paths:
            return True
        # A CORS preflight never carries credentials (browsers strip them), so requiring a key
        # would break every browser client; a plain OPTIONS without the CORS header is not exempt.
        return scope["method"] == "OPTIONS" and any(
            name == b"access-control-request-method" for name, _ in scope["headers"]
        )


def _match(keys: tuple[bytes, ...], presented: bytes) -> bytes | None:
    # Compare against every key without stopping early, so timing reveals neither
    # whether nor which key matched. Bytes: the header arrives as bytes, and compare_digest
    # needs equal types.
    matched: bytes | None = None
    for key in keys:
        if hmac.compare_digest(presented, key):
            matched = key
    return matched


def _bearer_token(scope: Scope) -> bytes | None:
    """The key presented: `Authorization: Bearer <key>` (OpenAI's), else `x-api-key: <key>`
    (Anthropic's, which its SDK sends)."""
    api_key = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            token = token.strip()
            if scheme.lower() != b"bearer" or not token:
                return None
            return bytes(token)
        if name == b"x-api-key" and value.strip():
            api_key = bytes(value.strip())
    return api_key


async def _throttle(send: Send, retry_after: float) -> None:
    message = "Too many failed authentication attempts from this address; retry later."
    body = error_json(message, type="invalid_request_error", code="rate_limit_exceeded")
    await send_error(send, 429, body, headers=[("retry-after", str(max(1, math.ceil(retry_after))))])


async def _reject(send: Send, message: str) -> None:
    body = error_json(message, type="invalid_request_error", code="invalid_api_key")
    await send_error(send, 401, body, headers=[("www-authenticate", "Bearer")])
