"""The idempotency store in Redis, shared by every replica that points at the same server.

One Redis hash per key, `surge:idempotency:<scoped key>`:
- running: `state=running`, `fp` (request fingerprint), `owner` (random token); expires
  after the lease unless the owner extends it;
- completed: `state=done`, `fp`, `status`, `headers` (JSON), `body` (raw bytes); expires
  after the TTL.

A tenant's quota (middleware/idempotency/store.py) is kept beside them: a sorted set
`surge:idempotency-tenant:<tenant>` of its keys by the time of their last write (Redis's `TIME`),
and a hash `surge:idempotency-tenant-bytes:<tenant>` of each key's stored bytes and their total.
A write past the quota deletes the tenant's oldest keys in the same script; members older than
the TTL (expired by Redis) are dropped from the set as it is written. Both expire after the TTL
of the tenant's last write. NOTE: a script that deletes keys it was not given, so a standalone
Redis (or one hash slot), as the rest of surge's state assumes.

Each operation is one Lua script, so it is atomic and costs one round trip: `claim` claims a
free key or reports its state (and the stored response) in the same step; `extend`,
`complete` and `release` check the owner token first. Expiry is Redis's own (`PEXPIRE`), so
a replica that dies mid-request frees its keys when its lease runs out.

Redis unavailable (down, or slower than the backend's timeout): every method raises
`StoreUnavailable`. NOTE: there is deliberately no in-process fallback here, unlike rate
limiting: a replica that claimed keys on its own during an outage could run a request that
another replica is running too, so the middleware answers 503 instead ("run once, never
twice").
NOTE: a `claim` whose reply is lost to the timeout may still have claimed the key in Redis;
that key then answers 409 until its lease runs out, as if its owner had died.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from middleware.idempotency.store import (
    Claim,
    ClaimState,
    StoredResponse,
    StoreUnavailable,
    TenantQuota,
    check_durations,
)
from middleware.redis import LUA_FORGET_MEMBER, RedisBackend, RedisUnavailable

KEY_PREFIX = "surge:idempotency:"
TENANT_PREFIX = "surge:idempotency-tenant:"
TENANT_BYTES_PREFIX = "surge:idempotency-tenant-bytes:"

# The tenant's bookkeeping, shared by the scripts that write or drop a key. KEYS[2] the tenant's
# set, KEYS[3] its bytes; `prefix` turns a member back into its key.
_TENANT = (
    LUA_FORGET_MEMBER
    + """
local function track(member, size, max_entries, max_bytes, ttl_ms, prefix)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl_ms)) do forget(old) end
  forget(member)
  redis.call('ZADD', KEYS[2], now, member)
  if size > 0 then
    redis.call('HSET', KEYS[3], member, size)
    redis.call('HINCRBY', KEYS[3], '#total', size)
  end
  while redis.call('ZCARD', KEYS[2]) > max_entries
      or tonumber(redis.call('HGET', KEYS[3], '#total') or '0') > max_bytes do
    local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if oldest == member then break end
    forget(oldest)
    redis.call('DEL', prefix .. oldest)
  end
  redis.call('PEXPIRE', KEYS[2], ttl_ms)
  redis.call('PEXPIRE', KEYS[3], ttl_ms)
end
"""
)

# KEYS[1] key, KEYS[2..3] its tenant's; ARGV fingerprint, owner, lease ms, member, max entries,
# max bytes, ttl ms, prefix. -> {"acquired"} | {"running"} | {"mismatch"} | {"done", status, headers, body}
_CLAIM = (
    _TENANT
    + """
local found = redis.call('HMGET', KEYS[1], 'state', 'fp', 'status', 'headers', 'body')
if not found[1] then
  redis.call('HSET', KEYS[1], 'state', 'running', 'fp', ARGV[1], 'owner', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  track(ARGV[4], 0, tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8])
  return {'acquired'}
end
if found[2] ~= ARGV[1] then return {'mismatch'} end
if found[1] == 'done' then return {'done', found[3], found[4], found[5]} end
return {'running'}
"""
)

# KEYS[1] key; ARGV owner, lease ms. -> 1 renewed, 0 not the owner of a running claim.
_EXTEND = """
local found = redis.call('HMGET', KEYS[1], 'state', 'owner')
if found[1] ~= 'running' or found[2] ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS[1] key, KEYS[2..3] its tenant's; ARGV owner, fingerprint, ttl ms, status, headers, body,
# member, max entries, max bytes, size. -> 1 stored, 0 not.
# A key that is gone (the lease ran out, nobody claimed it since) is stored too: this
# response is still the only one produced under it.
_COMPLETE = (
    _TENANT
    + """
local found = redis.call('HMGET', KEYS[1], 'state', 'owner')
if found[1] and (found[1] ~= 'running' or found[2] ~= ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'done', 'fp', ARGV[2], 'status', ARGV[4], 'headers', ARGV[5], 'body', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
track(ARGV[7], tonumber(ARGV[10]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[3]), ARGV[11])
return 1
"""
)

# KEYS[1] key, KEYS[2..3] its tenant's; ARGV owner, member. -> 1 released, 0 not the owner of a
# running claim.
_RELEASE = (
    _TENANT
    + """
local found = redis.call('HMGET', KEYS[1], 'state', 'owner')
if found[1] ~= 'running' or found[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
forget(ARGV[2])
return 1
"""
)


class RedisIdempotencyStore:
    def __init__(
        self, backend: RedisBackend, *, ttl_seconds: float, lease_seconds: float, quota: TenantQuota | None = None
    ) -> None:
        check_durations(ttl_seconds, lease_seconds)
        self.ttl_seconds = ttl_seconds
        self.lease_seconds = lease_seconds
        self.quota = quota if quota is not None else TenantQuota()
        self._backend = backend
        self._claim = backend.client.register_script(_CLAIM)
        self._extend = backend.client.register_script(_EXTEND)
        self._complete = backend.client.register_script(_COMPLETE)
        self._release = backend.client.register_script(_RELEASE)

    async def claim(self, key: str, fingerprint: str, owner: str, tenant: str = "") -> Claim:
        args = [fingerprint, owner, _ms(self.lease_seconds), *self._quota_args(key), _ms(self.ttl_seconds), KEY_PREFIX]
        reply = await self._run(self._claim, key, args, tenant)
        state = reply[0].decode()
        if state == "acquired":
            return Claim(ClaimState.ACQUIRED)
        if state == "running":
            return Claim(ClaimState.RUNNING)
        if state == "mismatch":
            return Claim(ClaimState.MISMATCH)
        status, headers, body = reply[1:]
        return Claim(ClaimState.COMPLETED, StoredResponse(int(status), _decode_headers(headers), bytes(body)))

    async def extend(self, key: str, owner: str) -> bool:
        return bool(await self._run(self._extend, key, [owner, _ms(self.lease_seconds)], None))

    async def complete(
        self, key: str, owner: str, fingerprint: str, response: StoredResponse, tenant: str = ""
    ) -> bool:
        headers = _encode_headers(response.headers)
        args: list[str | int | bytes] = [
            owner,
            fingerprint,
            _ms(self.ttl_seconds),
            response.status,
            headers,
            response.body,
            *self._quota_args(key),
            len(response.body) + len(headers),
            KEY_PREFIX,
        ]
        return bool(await self._run(self._complete, key, args, tenant))

    async def release(self, key: str, owner: str, tenant: str = "") -> bool:
        return bool(await self._run(self._release, key, [owner, key], tenant))

    def _quota_args(self, key: str) -> list[str | int | bytes]:
        return [key, self.quota.max_entries, self.quota.max_bytes]

    async def _run(self, script: AsyncScript, key: str, args: Sequence[str | int | bytes], tenant: str | None) -> Any:
        keys = [KEY_PREFIX + key]
        if tenant is not None:
            keys += [TENANT_PREFIX + tenant, TENANT_BYTES_PREFIX + tenant]

        async def operation(client: aioredis.Redis) -> Any:
            return await script(keys=keys, args=args, client=client)

        try:
            return await self._backend.call(operation)
        except RedisUnavailable as exc:
            raise StoreUnavailable(str(exc)) from exc


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _encode_headers(headers: tuple[tuple[bytes, bytes], ...]) -> str:
    return json.dumps([[name.decode("latin-1"), value.decode("latin-1")] for name, value in headers])


def _decode_headers(raw: bytes) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in json.loads(raw))
