"""Where the Responses API's stored responses live: this process's memory, or Redis with
`--redis-url` (the cache's Redis: `--redis-cache-url` when given), so every replica reads, continues,
deletes and cancels what any of them stored.

With Redis, a write that Redis does not take (down, or past its timeout) is kept in this process's
memory instead (the chain then continues on this replica only, as without Redis), and a read looks
there after Redis. A read that Redis cannot answer and memory does not hold is a 503 with a retry
hint, never a 404: the response may well exist, and a client told "not found" would start over.
"""

from __future__ import annotations

import logging

from app.runtime.response_store import ResponseStore, StoredResponse
from app.runtime.response_store_redis import RUNNING, RedisResponseStore
from middleware.errors import OpenAIError, service_unavailable
from middleware.redis import RedisUnavailable

log = logging.getLogger("surge.responses")

# A Redis that missed its timeout is usually back within its probe interval (middleware/redis.py).
RETRY_AFTER_SECONDS = 1.0


class ResponseStorage:
    def __init__(self, memory: ResponseStore, redis: RedisResponseStore | None = None) -> None:
        self.memory = memory
        self.redis = redis

    @property
    def is_shared(self) -> bool:
        """Whether other replicas see what is stored here (Redis)."""
        return self.redis is not None

    async def put(self, tenant: str, response_id: str, stored: StoredResponse, *, if_running: bool = False) -> bool:
        """Keep `stored`; False when it is past the tenant's bytes, or (`if_running`: a background
        run's end) when the stored response is no longer running: cancelled or deleted meanwhile."""
        unavailable = False
        if self.redis is not None:
            try:
                return await self.redis.put(tenant, response_id, stored, if_running=if_running)
            except RedisUnavailable as exc:
                log.warning("stored response %s kept in this replica's memory only: %s", response_id, exc)
                unavailable = True
        if if_running:
            kept = self.memory.get(tenant, response_id)
            # With Redis unanswered, one this memory does not hold was in Redis: kept here then.
            if (kept is None and not unavailable) or (kept is not None and kept.response.get("status") not in RUNNING):
                return False
        return self.memory.put(tenant, response_id, stored)

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        unavailable = None
        if self.redis is not None:
            try:
                found = await self.redis.get(tenant, response_id)
            except RedisUnavailable as exc:
                unavailable = exc
            else:
                if found is not None:
                    return found
        found = self.memory.get(tenant, response_id)
        if found is None and unavailable is not None:
            raise _unavailable(unavailable)
        return found

    async def delete(self, tenant: str, response_id: str) -> bool:
        deleted = self.memory.delete(tenant, response_id)
        if self.redis is not None:
            try:
                deleted = await self.redis.delete(tenant, response_id) or deleted
            except RedisUnavailable as exc:
                if not deleted:
                    raise _unavailable(exc) from None
        return deleted

    async def mark_cancelled(
        self, tenant: str, response_id: str, cancelled: StoredResponse
    ) -> tuple[bool, StoredResponse | None]:
        """For a background response that another replica runs: mark it cancelled where every
        replica sees it. (True, None) marked; (False, stored) it had finished; (False, None) none.
        Only where the store is shared (`is_shared`): without Redis every run is this replica's own."""
        assert self.redis is not None
        try:
            return await self.redis.cancel(tenant, response_id, cancelled)
        except RedisUnavailable as exc:
            raise _unavailable(exc) from None

    async def is_cancelled(self, tenant: str, response_id: str) -> bool:
        if self.redis is None:
            return False
        try:
            return await self.redis.is_cancelled(tenant, response_id)
        except RedisUnavailable:
            return False  # asked again on the next poll


def _unavailable(exc: BaseException) -> OpenAIError:
    return service_unavailable(f"Stored responses are unavailable for now ({exc}); try again.", RETRY_AFTER_SECONDS)
