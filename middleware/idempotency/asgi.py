"""`Idempotency-Key` on the completion endpoints, as a pure ASGI middleware.

Owns the request side of idempotency keys (Stripe's semantics, and the IETF httpapi
idempotency-key draft's): the first request with a key runs; a retry after it finished gets
the stored response byte for byte (status, headers, body, streams included) plus
`Idempotent-Replayed: true`; a retry while it runs gets 409 `idempotency_key_in_use` with
`Retry-After: 1` (the openai SDK retries 409 by itself); the same key with a different body
or endpoint gets 422 `idempotency_key_reused`. Keys are scoped per API key and are 1-255
printable ASCII characters (400 otherwise). Where the keys live is the store's business
(middleware/idempotency/store.py); this module must not know the engine or the routes.

What is stored: a response that completed (the app sent its last body message and the client
was still there) with status 2xx, or 4xx other than 408/409/425/429: a validation error is
the answer to that body, and Stripe stores those too. NOT stored: 408, 409, 425, 429, every
5xx, a stream that carries an in-stream error event, a response cut short by a disconnect or
an exception; the claim is then released so that the retry runs again.

Without the header a request passes straight through: no body read, no store call. With it,
the body is read once to fingerprint it (sha256 of the path and the body's canonical JSON)
and handed to the app by a `receive` that replays it once, then delegates to the server's.
NOTE: replaying it forever would make Starlette's disconnect listener spin (the request hangs at
full CPU), as in middleware/edge/body_limit.py.

The store unavailable (Redis down): 503 with `Retry-After`, never a run without a claim.
An outage after the claim is not undone: the response still reaches the client but may not
be stored (a later retry runs again), and an outage longer than the lease lets the key go
while the request still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from middleware.errors import error_json, send_error
from middleware.generation import MODEL_PATHS
from middleware.idempotency.redis_store import RedisIdempotencyStore
from middleware.idempotency.store import (
    ClaimState,
    IdempotencyStore,
    InMemoryIdempotencyStore,
    StoredResponse,
    StoreUnavailable,
    TenantQuota,
)
from middleware.redis import RedisBackend

log = logging.getLogger("surge.idempotency")

DEFAULT_PATHS = MODEL_PATHS
# Responses larger than this are not stored whole: one write of them would hold Redis (and the
# process's memory) for every tenant. Their key stores a small 422 instead, so a retry is told
# why it cannot be replayed rather than running the request again.
DEFAULT_MAX_STORED_BYTES = 8 * 1024 * 1024
MAX_KEY_LENGTH = 255
RETRY_AFTER_SECONDS = 1
REPLAYED_HEADER = (b"idempotent-replayed", b"true")
# Statuses a retry could turn into a success: never stored, so the retry runs again.
_RETRYABLE_CLIENT_ERRORS = frozenset({408, 409, 425, 429})
# Hop-by-hop and per-response headers; the server writes its own on a replay.
_UNSTORED_HEADERS = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server"})
# An SDK raises on any event whose JSON has an `error` key; such a stream is a failure.
_ERROR_EVENT = re.compile(rb'(?:^|\n)data: *\{\s*"error"')


@dataclass(slots=True)
class IdempotencyCounts:
    """Outcomes so far, read by the app's metrics (this layer exports nothing)."""

    num_replays: int = 0  # stored responses sent again
    num_conflicts: int = 0  # 409 (still running) and 422 (key reused with another body)


class IdempotencyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        store: IdempotencyStore,
        paths: Collection[str] = DEFAULT_PATHS,
        counts: IdempotencyCounts | None = None,
        max_stored_bytes: int = DEFAULT_MAX_STORED_BYTES,
    ) -> None:
        if store.lease_seconds <= 0:
            raise ValueError("the store's lease must be positive")
        self.app = app
        self.store = store
        self._max_stored_bytes = max_stored_bytes
        self._paths = frozenset(paths)
        self.counts = counts if counts is not None else IdempotencyCounts()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self._paths:
            await self.app(scope, receive, send)
            return
        raw_key = _header(scope, b"idempotency-key")
        if raw_key is None:
            await self.app(scope, receive, send)
            return
        key = raw_key.decode("latin-1").strip()
        if not _is_valid_key(key):
            await _invalid_key(send)
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client left mid-upload: there is nobody to answer
        api_key = scope.get("state", {}).get("api_key") or "anonymous"
        scoped_key = hashlib.sha256(f"{api_key}\0{key}".encode()).hexdigest()
        # The quota's owner: every caller without a key is one tenant, "anonymous".
        tenant = hashlib.sha256(f"tenant\0{api_key}".encode()).hexdigest()[:32]
        fingerprint = _fingerprint(scope["path"], body)
        owner = secrets.token_hex(16)
        try:
            claim = await self.store.claim(scoped_key, fingerprint, owner, tenant)
        except StoreUnavailable as exc:
            log.debug("idempotency store unavailable (%s): answering 503", exc)  # the backend logs the outage
            await _unavailable(send)
            return
        if claim.state is ClaimState.ACQUIRED:
            await self._run_once(scope, body, receive, send, _Claimed(scoped_key, fingerprint, owner, tenant))
        elif claim.state is ClaimState.COMPLETED and claim.response is not None:
            self.counts.num_replays += 1
            await _replay(send, claim.response)
        elif claim.state is ClaimState.RUNNING:
            self.counts.num_conflicts += 1
            await _in_use(send)
        else:
            self.counts.num_conflicts += 1
            await _reused(send)

    async def _run_once(self, scope: Scope, body: bytes, receive: Receive, send: Send, claimed: _Claimed) -> None:
        recorder = _Recorder(self.store, claimed, body, receive, send, self._max_stored_bytes)
        keeper = asyncio.create_task(self._keep_leased(claimed.key, claimed.owner))
        try:
            await self.app(scope, recorder.receive, recorder.send)
        finally:
            keeper.cancel()
            if not recorder.is_stored:
                with contextlib.suppress(StoreUnavailable):  # then the lease runs out by itself
                    await self.store.release(claimed.key, claimed.owner, claimed.tenant)

    async def _keep_leased(self, key: str, owner: str) -> None:
        """Extend the lease every third of it while the response is being produced."""
        interval = max(self.store.lease_seconds / 3, 0.01)
        while True:
            await asyncio.sleep(interval)
            try:
                if not await self.store.extend(key, owner):
                    log.warning("lost the idempotency lease of a running request; a retry may run it again")
                    return
            except StoreUnavailable as exc:
                log.debug("could not extend an idempotency lease (%s); trying again", exc)
            except Exception:
                log.exception("idempotency lease keeper failed")
                return


@dataclass(frozen=True, slots=True)
class _Claimed:
    """A key this request holds: the store's key, the body's fingerprint, the owner token, the tenant."""

    key: str
    fingerprint: str
    owner: str
    tenant: str


@dataclass(slots=True)
class _Recorder:
    """Passes one response through to the client, keeping what is needed to store it.

    The response is stored just before its last body message goes out, so a client that
    has the whole response and retries at once finds it stored.
    """

    _store: IdempotencyStore
    _claimed: _Claimed
    _request_body: bytes | None  # replayed once, then None
    _receive: Receive
    _send: Send
    _max_bytes: int
    _status: int = 0
    _headers: tuple[tuple[bytes, bytes], ...] = ()
    _chunks: list[bytes] = field(default_factory=list)
    _num_bytes: int = 0
    _is_too_large: bool = False
    _is_storable: bool = False
    is_disconnected: bool = False
    is_stored: bool = False

    async def receive(self) -> Message:
        if self._request_body is not None:  # the body, exactly once
            body, self._request_body = self._request_body, None
            return {"type": "http.request", "body": body, "more_body": False}
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.is_disconnected = True
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._status = message["status"]
            headers = ((name.lower(), value) for name, value in message.get("headers", ()))
            self._headers = tuple((name, value) for name, value in headers if name not in _UNSTORED_HEADERS)
            self._is_storable = _is_storable_status(self._status) and not _is_stand_in(self._headers)
        elif message["type"] == "http.response.body" and self._is_storable:
            chunk = bytes(message.get("body", b"")) if not self._is_too_large else b""
            self._num_bytes += len(chunk)
            if self._num_bytes > self._max_bytes:  # kept no further: a stand-in is stored at the end
                self._is_too_large, self._chunks = True, []
            elif chunk:
                self._chunks.append(chunk)
            if not message.get("more_body", False):
                await self._store_if_complete()
        await self._send(message)

    async def _store_if_complete(self) -> None:
        body = b"".join(self._chunks)
        self._chunks = []
        # NOTE: under ASGI 2.3 a disconnect cancels a stream before its last message; the flag
        # covers an app that saw the disconnect and still finished its response.
        if self.is_disconnected or (_is_event_stream(self._headers) and _has_error_event(body)):
            return
        response = StoredResponse(self._status, self._headers, body)
        if self._is_too_large:
            response = _too_large_to_replay(self._max_bytes)
        try:
            claimed = self._claimed
            self.is_stored = await self._store.complete(
                claimed.key, claimed.owner, claimed.fingerprint, response, claimed.tenant
            )
        except StoreUnavailable as exc:
            log.warning("could not store an idempotent response (%s); a retry will run again", exc)
            return
        if not self.is_stored:
            log.warning("another request holds this idempotency key now; the response was not stored")


def _too_large_to_replay(max_bytes: int) -> StoredResponse:
    message = (
        f"The response to this Idempotency-Key was larger than {max_bytes} bytes, so it was not stored and "
        "cannot be replayed; send the request again with a new key."
    )
    body = error_json(message, type="invalid_request_error", code="idempotency_response_too_large")
    return StoredResponse(422, ((b"content-type", b"application/json"),), body)


def _is_storable_status(status: int) -> bool:
    return 200 <= status < 300 or (400 <= status < 500 and status not in _RETRYABLE_CLIENT_ERRORS)


def _is_stand_in(headers: tuple[tuple[bytes, bytes], ...]) -> bool:
    """A reply served instead of a generation under overload (degradation level 3 or 4): a
    failure that a retry could fix, so it must not become the key's answer for a day."""
    return any(name == b"x-surge-degraded" and value in (b"3", b"4") for name, value in headers)


def _is_event_stream(headers: tuple[tuple[bytes, bytes], ...]) -> bool:
    return any(name == b"content-type" and value.startswith(b"text/event-stream") for name, value in headers)


def _fingerprint(path: str, body: bytes) -> str:
    """sha256 of the endpoint and the body's canonical JSON (its raw bytes if it is not JSON).

    Canonical, as Stripe compares parameters rather than bytes: the same request retried
    by another client library, with other key order or spacing, is still the same request.
    """
    try:
        canonical = b"json\n" + json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        canonical = b"raw\n" + body
    return hashlib.sha256(path.encode() + b"\n" + canonical).hexdigest()


def _has_error_event(body: bytes) -> bool:
    # The substring test first: a stream's whole body is searched once per stored response, and
    # the regex over all of it costs far more than the test.
    return b'"error"' in body and _ERROR_EVENT.search(body) is not None


def _is_valid_key(key: str) -> bool:
    """1-255 printable ASCII characters (the IETF draft's sf-string alphabet): no control
    characters, and no bytes past ASCII, whose meaning depends on the client's encoding."""
    return 0 < len(key) <= MAX_KEY_LENGTH and key.isascii() and key.isprintable()


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return bytes(value)
    return None


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _replay(send: Send, response: StoredResponse) -> None:
    headers = [*response.headers, REPLAYED_HEADER]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


def _retry_after() -> list[tuple[str, str]]:
    return [("retry-after", str(RETRY_AFTER_SECONDS)), ("retry-after-ms", str(RETRY_AFTER_SECONDS * 1000))]


async def _invalid_key(send: Send) -> None:
    message = f"The Idempotency-Key header must be 1 to {MAX_KEY_LENGTH} printable ASCII characters."
    await send_error(send, 400, error_json(message, type="invalid_request_error", code="invalid_idempotency_key"))


async def _in_use(send: Send) -> None:
    message = "A request with this Idempotency-Key is still in progress; retry after it has finished."
    body = error_json(message, type="invalid_request_error", code="idempotency_key_in_use")
    await send_error(send, 409, body, headers=_retry_after())


async def _reused(send: Send) -> None:
    message = "This Idempotency-Key was already used with a different request (body or endpoint); use a new key."
    body = error_json(message, type="invalid_request_error", code="idempotency_key_reused")
    await send_error(send, 422, body)


async def _unavailable(send: Send) -> None:
    message = "Idempotency keys are unavailable right now (the shared store does not answer); retry shortly."
    body = error_json(message, type="server_error", code="idempotency_store_unavailable")
    await send_error(send, 503, body, headers=_retry_after())


def build_store(
    redis: RedisBackend | None, *, ttl_seconds: float, lease_seconds: float, quota: TenantQuota | None = None
) -> IdempotencyStore:
    """The Redis store when Redis is configured (shared by replicas), else the in-process one."""
    if redis is not None:
        return RedisIdempotencyStore(redis, ttl_seconds=ttl_seconds, lease_seconds=lease_seconds, quota=quota)
    return InMemoryIdempotencyStore(ttl_seconds=ttl_seconds, lease_seconds=lease_seconds, quota=quota)
