"""The door's ASGI stack, built from `middleware.DOOR`: each name's middleware, configured from the
settings, in that order (the order and its reasons are middleware/__init__.py's). A layer that is off
(no CORS origins, no rate limit) is left out of the stack rather than passed through. Auth reads the
keys from `state.keys`, which a reload of the keys file replaces, and hands the later per-key layers
the set it used; with a keys file they stay in the stack even with no limit yet: a reload may bring
one."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from app.config.settings import Settings
from app.runtime.state import RETRY_AFTER_SECONDS, ServerState
from middleware import DOOR
from middleware.edge.allowed_hosts import ANY_HOST, AllowedHostsMiddleware
from middleware.edge.auth import ApiKeyMiddleware
from middleware.edge.body_limit import BodyLimitMiddleware
from middleware.edge.draining import DrainingMiddleware
from middleware.edge.error_shape import ErrorShapeMiddleware
from middleware.edge.request_id import RequestIdMiddleware
from middleware.idempotency.asgi import IdempotencyMiddleware, build_store
from middleware.idempotency.store import TenantQuota
from middleware.rate_limit.asgi import RateLimitMiddleware
from middleware.rate_limit.buckets import InProcessBuckets, RedisBuckets
from middleware.rate_limit.concurrency import ConcurrencyMiddleware

Entry = tuple[type, dict[str, object]]


def install_door_layers(app: FastAPI, settings: Settings, state: ServerState, http_metrics: Entry) -> list[type]:
    """Add the door's middleware to `app`, outermost first as `DOOR` lists them; return their classes
    in that order (what is on)."""
    factories: dict[str, Callable[[], Entry | None]] = {
        "request_id": lambda: (RequestIdMiddleware, {}),
        "error_shape": lambda: (ErrorShapeMiddleware, {}),
        "cors": lambda: _cors(settings),
        "http_metrics": lambda: http_metrics,
        "allowed_hosts": lambda: _allowed_hosts(settings),
        "draining": lambda: (
            DrainingMiddleware,
            {"is_draining": lambda: state.is_shutting_down, "retry_after_seconds": RETRY_AFTER_SECONDS},
        ),
        "auth": lambda: (ApiKeyMiddleware, {"ring": state.keys, "failures": state.auth_failures}),
        "body_limit": lambda: (BodyLimitMiddleware, {"max_body_bytes": settings.max_body_bytes or state.body_limit}),
        "rate_limit": lambda: _rate_limit(settings, state),
        "concurrency": lambda: _concurrency(settings, state),
        "idempotency": lambda: (
            IdempotencyMiddleware,
            {
                "store": build_store(
                    state.redis_cache,
                    ttl_seconds=settings.idempotency_ttl_seconds,
                    lease_seconds=settings.idempotency_lease_seconds,
                    quota=TenantQuota(
                        settings.idempotency_max_keys_per_tenant, settings.idempotency_max_bytes_per_tenant
                    ),
                ),
                "counts": state.idempotency_counts,
                "max_stored_bytes": settings.idempotency_max_bytes,
            },
        ),
    }
    if set(factories) != set(DOOR):
        raise RuntimeError(f"door layers {sorted(factories)} do not match middleware.DOOR {DOOR}")
    stack = [entry for entry in (factories[name]() for name in DOOR) if entry is not None]
    for cls, options in reversed(stack):
        app.add_middleware(cls, **options)  # type: ignore[arg-type]
    return [cls for cls, _ in stack]


def _cors(settings: Settings) -> Entry | None:
    if not settings.cors_origin:
        return None
    options: dict[str, object] = {
        "allow_origins": list(settings.cors_origin),
        "allow_methods": ["*"],
        "allow_headers": ["*"],
        "expose_headers": ["*"],
    }
    return CORSMiddleware, options


def _allowed_hosts(settings: Settings) -> Entry | None:
    """The Host check, while auth is off and `--allowed-host '*'` is not given. The name surge is
    bound to (`--host surge.lan`) is allowed too; an address needs no entry."""
    if settings.is_auth_on or ANY_HOST in settings.allowed_host:
        return None
    return AllowedHostsMiddleware, {"allowed_hosts": (*settings.allowed_host, settings.host)}


def _concurrency(settings: Settings, state: ServerState) -> Entry | None:
    """The per-key concurrency layer, when --max-concurrent-per-key or a keys file is set."""
    if not settings.max_concurrent_per_key and not settings.keys_file:
        return None
    return ConcurrencyMiddleware, {"default_limit": settings.max_concurrent_per_key, "counts": state.concurrency_counts}


def _rate_limit(settings: Settings, state: ServerState) -> Entry | None:
    """The requests-bucket layer, when --rate-limit-rpm / --rate-limit-tpm or a keys file is set."""
    limits = settings.rate_limits
    if not limits.is_limited and not settings.keys_file:
        return None
    if state.redis is None:
        state.rate_limits = InProcessBuckets()
    else:
        state.rate_limits = RedisBuckets(state.redis, fallback_share=settings.rate_limit_replicas)
    options: dict[str, object] = {"buckets": state.rate_limits, "limits": limits, "counts": state.rate_limit_counts}
    return RateLimitMiddleware, options
