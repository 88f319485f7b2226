"""Stored responses (the Responses API's `store`), per tenant: what `GET /v1/responses/{id}`, its
`input_items` and `previous_response_id` read.

A tenant is the API key (every caller is one tenant with auth off); another key's ids are not
found, for reading, deleting and continuing alike. Each tenant keeps at most `max_entries`
responses and `max_bytes` of them, each for `ttl_seconds`: past a bound its own oldest go, never
another tenant's. This is the in-memory store (a chain continues on the replica that stored it);
app/runtime/response_store_redis.py keeps the same in Redis for a fleet, and
app/runtime/response_storage.py picks between them.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_entries: int = 1000
    max_bytes: int = 64 * 1024 * 1024
    ttl_seconds: float = 86_400.0

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1 or self.ttl_seconds <= 0:
            raise ValueError("stored responses need positive entries, bytes and seconds per tenant")


@dataclass(slots=True)
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]  # this request's own input, as items with ids
    # What a continuation (previous_response_id) starts from: the chain's items before this
    # response, its input and its output.
    context: list[dict[str, Any]]
    num_bytes: int = 0
    expires_at: float = 0.0

    def __post_init__(self) -> None:
        if not self.num_bytes:
            self.num_bytes = len(json.dumps([self.response, self.input_items, self.context]))


@dataclass(slots=True)
class _Tenant:
    entries: OrderedDict[str, StoredResponse] = field(default_factory=OrderedDict)  # oldest first
    num_bytes: int = 0


class ResponseStore:
    def __init__(self, limits: StoreLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}

    def put(self, tenant: str, response_id: str, stored: StoredResponse) -> bool:
        """Keep `stored`; False when it alone is past the tenant's byte bound (kept nowhere)."""
        if stored.num_bytes > self.limits.max_bytes:
            return False
        self._drop(tenant, response_id)
        entries = self._tenants.setdefault(tenant, _Tenant())
        stored.expires_at = self._clock() + self.limits.ttl_seconds
        entries.entries[response_id] = stored
        entries.num_bytes += stored.num_bytes
        self._sweep(tenant)
        while len(entries.entries) > self.limits.max_entries or entries.num_bytes > self.limits.max_bytes:
            self._drop(tenant, next(iter(entries.entries)))
        return True

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        entries = self._tenants.get(tenant)
        stored = entries.entries.get(response_id) if entries is not None else None
        if stored is not None and stored.expires_at <= self._clock():
            self._drop(tenant, response_id)
            return None
        return stored

    def delete(self, tenant: str, response_id: str) -> bool:
        return self.get(tenant, response_id) is not None and self._drop(tenant, response_id)

    def usage(self, tenant: str) -> tuple[int, int]:
        """(entries, bytes) the tenant keeps."""
        entries = self._tenants.get(tenant)
        return (len(entries.entries), entries.num_bytes) if entries is not None else (0, 0)

    def _sweep(self, tenant: str) -> None:
        """The tenant's expired entries go (oldest first: they expire in the order they came)."""
        entries, now = self._tenants[tenant], self._clock()
        while entries.entries:
            oldest_id, oldest = next(iter(entries.entries.items()))
            if oldest.expires_at > now:
                break
            self._drop(tenant, oldest_id)

    def _drop(self, tenant: str, response_id: str) -> bool:
        entries = self._tenants.get(tenant)
        stored = entries.entries.pop(response_id, None) if entries is not None else None
        if entries is None or stored is None:
            return False
        entries.num_bytes -= stored.num_bytes
        if not entries.entries:
            del self._tenants[tenant]
        return True
