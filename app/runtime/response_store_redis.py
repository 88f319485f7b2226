"""Stored responses in Redis, shared by every replica that points at the same server: a chain
started on one replica continues on another, and any replica reads, deletes or cancels it.

One Redis hash per response, `surge:response:<tenant>:<id>`: `data` (the stored response as JSON),
`status` (the Response's), and `cancel` once a replica that does not run a background response
was asked to cancel it (the replica that runs it looks for the mark: app/responses/background.py).
The tenant part is a digest of the tenant (an API key must not appear in key names: `KEYS *` and
`MONITOR` show them). Beside them, per tenant, as the idempotency store keeps its quota: a sorted
set `surge:responses-tenant:<tenant>` of its ids by the time of their last write (Redis's `TIME`),
and a hash `surge:responses-tenant-bytes:<tenant>` of each one's bytes and their total. A write past
the tenant's entries or bytes deletes its own oldest in the same script, never another tenant's;
every key expires after the TTL (Redis's `PEXPIRE`), so a replica that dies leaves nothing for good.
NOTE: scripts that delete keys they were not given, so a standalone Redis (or one hash slot), as the
rest of surge's shared state assumes.

Redis unavailable (down, or slower than the backend's timeout): every method raises
`RedisUnavailable`; app/runtime/response_storage.py decides what the caller gets.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from redis.commands.core import AsyncScript

from app.runtime.response_store import StoredResponse, StoreLimits
from middleware.redis import LUA_FORGET_MEMBER, RedisBackend

KEY_PREFIX = "surge:response:"
TENANT_PREFIX = "surge:responses-tenant:"
TENANT_BYTES_PREFIX = "surge:responses-tenant-bytes:"
# Statuses a background response is still running in: a cancel takes effect, a write may follow.
RUNNING = ("queued", "in_progress")

# KEYS[1] the response, KEYS[2..3] its tenant's; ARGV id, data, status, size, max entries, max
# bytes, ttl ms, prefix, if_running. -> 1 stored, 0 not (if_running: the stored one is no longer
# running: cancelled, deleted or gone past a bound; it stays as it is).
_PUT = (
    LUA_FORGET_MEMBER
    + """
if ARGV[9] == '1' then
  local status = redis.call('HGET', KEYS[1], 'status')
  if status ~= 'queued' and status ~= 'in_progress' then return 0 end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[7])
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl)) do forget(old) end
forget(ARGV[1])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'status', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('HINCRBY', KEYS[3], '#total', ARGV[4])
while redis.call('ZCARD', KEYS[2]) > tonumber(ARGV[5])
    or tonumber(redis.call('HGET', KEYS[3], '#total') or '0') > tonumber(ARGV[6]) do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if oldest == ARGV[1] then break end
  forget(oldest)
  redis.call('DEL', ARGV[8] .. oldest)
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return 1
"""
)

# KEYS[1] the response, KEYS[2..3] its tenant's; ARGV id. -> 1 deleted, 0 not there.
_DELETE = (
    LUA_FORGET_MEMBER
    + """
forget(ARGV[1])
return redis.call('DEL', KEYS[1])
"""
)

# KEYS[1] the response; ARGV the cancelled response's data. -> {1} marked cancelled, {0, data}
# already finished (its stored data), {} not there.
_CANCEL = """
local found = redis.call('HMGET', KEYS[1], 'status', 'data')
if not found[1] then return {} end
if found[1] ~= 'queued' and found[1] ~= 'in_progress' then return {0, found[2]} end
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'data', ARGV[1], 'cancel', '1')
return {1}
"""


def tenant_digest(tenant: str) -> str:
    return hashlib.sha256(tenant.encode()).hexdigest()[:32]


def encode(stored: StoredResponse) -> bytes:
    return json.dumps([stored.response, stored.input_items, stored.context], separators=(",", ":")).encode()


def decode(data: bytes | str) -> StoredResponse:
    response, input_items, context = json.loads(data)
    return StoredResponse(response, input_items, context, num_bytes=len(data))  # bytes: decode_responses is off


class RedisResponseStore:
    def __init__(self, backend: RedisBackend, limits: StoreLimits) -> None:
        self.limits = limits
        self._backend = backend
        self._put = backend.client.register_script(_PUT)
        self._delete = backend.client.register_script(_DELETE)
        self._cancel = backend.client.register_script(_CANCEL)

    async def put(self, tenant: str, response_id: str, stored: StoredResponse, *, if_running: bool = False) -> bool:
        """Keep `stored`; False when it alone is past the tenant's bytes (kept nowhere) or, with
        `if_running`, when the stored one is no longer running (cancelled or deleted meanwhile)."""
        data = encode(stored)
        if len(data) > self.limits.max_bytes:
            return False
        digest = tenant_digest(tenant)
        args: list[str | int | bytes] = [
            response_id,
            data,
            str(stored.response.get("status", "")),
            len(data),
            self.limits.max_entries,
            self.limits.max_bytes,
            int(self.limits.ttl_seconds * 1000),
            KEY_PREFIX + digest + ":",
            "1" if if_running else "0",
        ]
        return bool(await self._run(self._put, digest, response_id, args))

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        key = KEY_PREFIX + tenant_digest(tenant) + ":" + response_id
        data = await self._backend.call(lambda client: client.hget(key, "data"))
        return decode(data) if data is not None else None

    async def delete(self, tenant: str, response_id: str) -> bool:
        return bool(await self._run(self._delete, tenant_digest(tenant), response_id, [response_id]))

    async def cancel(
        self, tenant: str, response_id: str, cancelled: StoredResponse
    ) -> tuple[bool, StoredResponse | None]:
        """Mark a running background response cancelled, with `cancelled` as what it now reads.
        (True, None) when marked; (False, the stored one) when it had finished; (False, None) when
        there is none."""
        key = KEY_PREFIX + tenant_digest(tenant) + ":" + response_id
        data = encode(cancelled)
        reply = await self._backend.call(lambda client: self._cancel(keys=[key], args=[data], client=client))
        if not reply:
            return False, None
        if int(reply[0]) == 1:
            return True, None
        return False, decode(reply[1])

    async def is_cancelled(self, tenant: str, response_id: str) -> bool:
        """Whether a replica cancelled or deleted this response (app/responses/background.py asks)."""
        key = KEY_PREFIX + tenant_digest(tenant) + ":" + response_id
        cancel, status = await self._backend.call(lambda client: client.hmget(key, ["cancel", "status"]))
        return cancel is not None or status is None

    async def _run(self, script: AsyncScript, digest: str, response_id: str, args: Sequence[str | int | bytes]) -> Any:
        keys = [KEY_PREFIX + digest + ":" + response_id, TENANT_PREFIX + digest, TENANT_BYTES_PREFIX + digest]
        return await self._backend.call(lambda client: script(keys=keys, args=args, client=client))
