"""The server's open connections, counted per client address, and which to close when there are too many.

uvicorn's `limit_concurrency` counted idle keep-alive sockets like busy ones and answered every
request past it with a 503, `/health` and `/ready` included: 2,048 idle sockets from one address
locked every client out and the kubelet restarted the pod. This registry takes its place; the
connection protocol (app/server/http_protocol.py) reports each connection's phase to it:

- IDLE: before its first request or between requests; RECEIVING: a request's headers or body are
  arriving, at the client's pace (bounded by the header and body deadlines); SERVING: the server
  is answering.
- Per address, at most `max_per_address` connections may be IDLE or RECEIVING: a new one past it
  closes that address's oldest idle connection, or, when it has none, is itself closed at once.
  SERVING connections do not count: requests being answered are the traffic layers' to bound
  (per-key concurrency, queue bounds), and one client with many requests in flight is no attack.
- Over all addresses, past `max_connections` the oldest idle connection is closed to make room;
  when none is idle, PROBE_RESERVE more may open, on which only probes are answered (`/health`,
  `/ready`, `/metrics`; anything else a 503, `may_serve`), and past those a new one is closed at once.

Knows nothing of asyncio, uvicorn or HTTP: a connection is anything with an `address` and a
`close_now()`. Reads no clock: "oldest idle" is the order connections became idle in.
"""

from __future__ import annotations

import enum
from collections import Counter
from typing import Protocol

# Connections past --max-connections that may open while none is idle, for probes and scrapes
# (the kubelet's liveness, readiness and startup probes, Prometheus), each a short request.
PROBE_RESERVE = 16
# Answered even on a connection past --max-connections: a refused probe restarts the pod.
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})


class Phase(enum.Enum):
    IDLE = "idle"
    RECEIVING = "receiving"
    SERVING = "serving"


class Connection(Protocol):
    @property
    def address(self) -> str: ...

    def close_now(self) -> None: ...


class Connections:
    """One per server, shared by all its connections (the protocol factory holds it) and read by
    app/ops/metrics.py."""

    def __init__(self, max_connections: int, max_per_address: int) -> None:
        """max_connections, max_per_address: 0 = no bound."""
        if max_connections < 0 or max_per_address < 0:
            raise ValueError("max_connections and max_per_address must be 0 (no bound) or positive")
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self._phases: dict[Connection, Phase] = {}
        # Insertion-ordered: the first is the one idle longest.
        self._idle: dict[Connection, None] = {}
        self._idle_by_address: dict[str, dict[Connection, None]] = {}
        self._waiting = Counter[str]()  # IDLE or RECEIVING connections per address
        self.num_evicted = 0  # idle connections closed to make room
        self.num_refused_address = 0  # new connections closed: their address had too many waiting
        self.num_refused_full = 0  # new connections closed: the server was full, reserve included
        self.num_over_limit = 0  # requests answered 503 past max_connections
        self.num_send_timeouts = 0  # connections cut because their client stopped reading

    @property
    def num_open(self) -> int:
        return len(self._phases)

    @property
    def num_idle(self) -> int:
        return len(self._idle)

    def admit(self, connection: Connection) -> bool:
        """Register a new connection as IDLE, closing idle ones to make room; False: close it at once."""
        address = connection.address
        if self.max_per_address and self._waiting[address] >= self.max_per_address:
            victim = _first(self._idle_by_address.get(address))
            if victim is None:
                self.num_refused_address += 1
                return False
            self._evict(victim)
        if self.max_connections and self.num_open >= self.max_connections:
            victim = _first(self._idle)
            if victim is not None:
                self._evict(victim)
            elif self.num_open >= self.max_connections + PROBE_RESERVE:
                self.num_refused_full += 1
                return False
        self._enter(connection, Phase.IDLE)
        return True

    def set_phase(self, connection: Connection, phase: Phase) -> None:
        current = self._phases.get(connection)
        if current is None or current is phase:  # closed already (evicted), or no change
            return
        self._leave(connection, current)
        self._enter(connection, phase)

    def remove(self, connection: Connection) -> None:
        """The connection is gone (or going); idempotent."""
        phase = self._phases.get(connection)
        if phase is not None:
            self._leave(connection, phase)

    def may_serve(self, path: str) -> bool:
        """Whether a request for `path` may start now: within max_connections (closing idle
        connections to get there), or a probe."""
        while self.max_connections and self.num_open > self.max_connections:
            victim = _first(self._idle)
            if victim is None:
                if path in PROBE_PATHS:
                    return True
                self.num_over_limit += 1
                return False
            self._evict(victim)
        return True

    def _evict(self, connection: Connection) -> None:
        self.remove(connection)  # at once: its close completes later, and it must not count meanwhile
        self.num_evicted += 1
        connection.close_now()

    def _enter(self, connection: Connection, phase: Phase) -> None:
        self._phases[connection] = phase
        address = connection.address
        if phase is Phase.IDLE:
            self._idle[connection] = None
            self._idle_by_address.setdefault(address, {})[connection] = None
        if phase is not Phase.SERVING:
            self._waiting[address] += 1

    def _leave(self, connection: Connection, phase: Phase) -> None:
        del self._phases[connection]
        address = connection.address
        if phase is Phase.IDLE:
            del self._idle[connection]
            idle = self._idle_by_address[address]
            del idle[connection]
            if not idle:
                del self._idle_by_address[address]
        if phase is not Phase.SERVING:
            self._waiting[address] -= 1
            if not self._waiting[address]:
                del self._waiting[address]


def _first(connections: dict[Connection, None] | None) -> Connection | None:
    return next(iter(connections), None) if connections else None
