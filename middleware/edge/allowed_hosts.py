"""The `Host` check that stops DNS rebinding while auth is off, as a pure ASGI middleware.

DNS rebinding: a web page at `evil.example` whose name is then made to resolve to 127.0.0.1 has
the visitor's browser send requests to the surge on their machine as same-origin requests, so no
CORS rule applies and the page reads every answer. The browser still sends `Host: evil.example`;
with no API key to present, that is what gives the page away.

Rules (app/server/door.py installs this layer only while auth is off and `--allowed-host '*'` is not
given: with auth on the key protects, whatever the name):
- non-HTTP scopes and the probe paths (`/health`, `/ready`: a kubelet may send any Host) pass;
- a Host that is an IP address (`127.0.0.1:8000`, `[::1]`, a pod's IP) passes, any port: a
  rebinding page's origin is a name, so its requests never carry an address (Vite's rule too);
- `localhost` passes (browsers resolve it to loopback themselves, without DNS), and so do the
  configured names (`--allowed-host`; `*.example.com` for every subdomain of example.com);
- anything else, a missing Host included, gets a 421 in OpenAI's error shape before any other
  layer runs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from middleware.errors import INVALID_REQUEST, error_json, send_error

DEFAULT_EXEMPT_PATHS = ("/health", "/ready")
ANY_HOST = "*"
_LOOPBACK_NAMES = frozenset({"localhost"})
_MAX_ECHOED = 100  # characters of a refused Host named in the error


def check_allowed_host(entry: str) -> str:
    """An `--allowed-host` value, lower-cased: a name (`surge.example.com`), `*.` before a domain
    for its subdomains, an address, or `*` (the check off); a ValueError for anything else."""
    host = entry.strip().lower()
    if host == ANY_HOST:
        return host
    host = host.rstrip(".")
    name = host.removeprefix("*.")
    if not name or (any(c in name for c in "*/:@ \t") and not _is_address(name)):
        raise ValueError(f"--allowed-host {entry!r}: give a host name (no port, no scheme), `*.domain` or `*`")
    return host


class AllowedHostsMiddleware:
    def __init__(
        self, app: ASGIApp, *, allowed_hosts: Collection[str], exempt_paths: Collection[str] = DEFAULT_EXEMPT_PATHS
    ) -> None:
        hosts = {check_allowed_host(host) for host in allowed_hosts}
        if ANY_HOST in hosts:
            raise ValueError("`*` turns the check off: leave this layer out instead")
        self.app = app
        self._names = frozenset(host for host in hosts if not host.startswith("*.")) | _LOOPBACK_NAMES
        self._suffixes = tuple(host[1:] for host in hosts if host.startswith("*."))  # ".example.com"
        self._exempt_paths = frozenset(exempt_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._exempt_paths:
            await self.app(scope, receive, send)
            return
        host = _host(scope)
        if host is not None and self.is_allowed(host):
            await self.app(scope, receive, send)
            return
        named = "No Host header" if host is None else f"Host {host[:_MAX_ECHOED]!r}"
        message = (
            f"{named}: with auth off this server answers only localhost, IP addresses and the names"
            " given with --allowed-host (a guard against DNS rebinding)."
        )
        await send_error(send, 421, error_json(message, type=INVALID_REQUEST, code="host_not_allowed"))

    def is_allowed(self, host: str) -> bool:
        """`host`: the Host header's name or address, port removed, lower-cased."""
        return host in self._names or _is_address(host) or host.endswith(self._suffixes)


def _host(scope: Scope) -> str | None:
    """The Host header without its port, lower-cased and without a trailing dot; None when absent."""
    for name, value in scope["headers"]:
        if name == b"host":
            text = value.decode("latin-1").strip().lower()
            if text.startswith("["):  # [v6]:port
                return text.partition("]")[0] + "]"
            name_part, _, port = text.rpartition(":")
            if name_part and port.isdigit():
                text = name_part
            return text.rstrip(".")
    return None


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        return False
    return True
