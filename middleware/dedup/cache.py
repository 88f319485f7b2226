"""Identical deterministic requests share one generation: single flight plus a TTL cache.

A request is eligible when its result is determined (greedy, or a seed given), it asks for one
choice of one prompt, and it does not say `Cache-Control: no-cache` (or `no-store`). Its
fingerprint covers the served model, the endpoint, the prompt's token ids and every sampling
parameter; not `stream`, so a streamed and a non-streamed request share one generation. It also
covers the caller's API key (scope `key`, the default), so one tenant never receives another's
completion, nor learns from a fast reply (or the hit counter) that someone sent the same prompt;
scope `global` shares across keys (`--dedup-scope`). With auth off there is one tenant.

- Single flight: the first request starts a *flight*, owned by this cache (not by any client),
  which relays the engine's deltas to every handle listening. A handle that joins late first
  gets the deltas so far, then live ones. A handle's `close()` only stops it listening; the
  engine request is aborted when the last listener leaves before the end.
- A successful result is kept for `ttl` seconds (in process, and in Redis when given) and
  replayed to later identical requests. Errors reach every listener and are never cached.
- Across replicas (Redis): an efficiency lock, never a correctness one. The replica that takes
  the lock generates and renews the lock while it runs; the others poll for the stored result
  (bounded by `max_wait`) and take the lock over if it is freed or expires, so a crashed owner
  costs at most one lease. Redis slow or down, or the wait given up: compute locally.
  NOTE: listeners on *other* replicas get the result only when it is finished, replayed all at
  once (a stream waits silently, with keep-alives, then catches up in one write); listeners on
  the owning replica always get live deltas.
- Counters: `num_hits` (joined a flight, or replayed a result), `num_misses` (eligible and ran
  the engine), `num_bypassed` (not eligible).

A handle (`SharedGeneration`, middleware/dedup/flight.py) is used like the engine's `RequestGroup`
(see `OutputSource`), so the routes' streaming and collecting code does not change. Storage lives
in middleware/dedup/store.py. Knows nothing of HTTP beyond request headers, nor of the engine
beyond its outputs: the caller's `start()` submits.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import fields

from middleware.dedup.flight import Flight, SharedGeneration
from middleware.dedup.store import Claim, LocalResults, RedisDedupStore
from middleware.generation import Generation, Handler
from middleware.redis import RedisBackend, RedisUnavailable
from models import OutputSource, SamplingParams

log = logging.getLogger("surge.dedup")

DEFAULT_LEASE_SECONDS = 10.0  # a crashed owner delays other replicas by at most this
DEFAULT_MAX_WAIT_SECONDS = 60.0  # a follower on another replica computes itself after this
DEFAULT_POLL_SECONDS = 0.05  # how often such a follower asks Redis
DEFAULT_MAX_ENTRIES = 1024  # finished results kept in process
DEFAULT_MAX_TOKENS = 131_072  # and their tokens (and logprob alternatives) in all: ~40 MB at most


def wants_fresh(headers: Mapping[str, str]) -> bool:
    """`Cache-Control: no-cache` or `no-store`: the client asks for its own generation."""
    getlist = getattr(headers, "getlist", None)  # Starlette's Headers: every Cache-Control line
    values = getlist("cache-control") if getlist is not None else [headers.get("cache-control", "")]
    directives = {part.split("=", 1)[0].strip().lower() for value in values for part in value.split(",")}
    return "no-cache" in directives or "no-store" in directives


_PARAM_FIELDS = tuple(f.name for f in fields(SamplingParams))


DEDUP_SCOPES = ("key", "global")


def request_fingerprint(
    *,
    model: str,
    endpoint: str,
    prompts: Sequence[Sequence[int]],
    choice_params: Sequence[SamplingParams],
    tenant: str = "",
) -> str | None:
    """sha256 of everything that decides the output; None when the output is not determined."""
    if len(prompts) != 1 or len(choice_params) != 1:
        return None
    params = choice_params[0]
    if not (params.is_greedy or params.seed is not None):
        return None
    # Every SamplingParams field, so a field added later is part of the key without a change here.
    # Shallow (no field is a dataclass): `asdict` deep-copies, a third of this function's time.
    fields_ = {name: getattr(params, name) for name in _PARAM_FIELDS}
    canonical = {"v": 1, "model": model, "endpoint": endpoint, "prompt": list(prompts[0]), "params": fields_}
    if tenant:  # "" (global scope, or auth off) keeps the keys the cache always had
        canonical["tenant"] = tenant
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class DedupCache:
    def __init__(
        self,
        *,
        ttl: float,
        redis: RedisBackend | None = None,
        lease: float = DEFAULT_LEASE_SECONDS,
        max_wait: float = DEFAULT_MAX_WAIT_SECONDS,
        poll_interval: float = DEFAULT_POLL_SECONDS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        clock: Callable[[], float] = time.monotonic,
        scope: str = "key",
    ) -> None:
        """ttl: seconds a finished result is replayed (0 = dedup off). clock: for that TTL only.
        scope: "key" (results shared only among requests of one API key) or "global"."""
        if ttl < 0:
            raise ValueError("the dedup TTL must be 0 (off) or positive")
        if scope not in DEDUP_SCOPES:
            raise ValueError(f"the dedup scope must be one of {', '.join(DEDUP_SCOPES)}")
        self.scope = scope
        if lease <= 0 or max_wait < 0 or poll_interval <= 0:
            raise ValueError("lease and poll_interval must be positive, max_wait not negative")
        self.ttl = ttl
        self._lease = lease
        self._max_wait = max_wait
        self._poll_interval = poll_interval
        self._results = LocalResults(ttl=ttl, max_entries=max_entries, max_tokens=max_tokens, clock=clock)
        self._store = RedisDedupStore(redis, ttl=ttl, lease=lease) if redis is not None and ttl > 0 else None
        self._flights: dict[str, Flight] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.num_hits = 0
        self.num_misses = 0
        self.num_bypassed = 0

    @property
    def is_idle(self) -> bool:
        """No generation in flight and no task left (tests and shutdown check this)."""
        return not self._flights and not self._tasks

    def fingerprint(
        self,
        headers: Mapping[str, str],
        *,
        model: str,
        endpoint: str,
        prompts: Sequence[Sequence[int]],
        choice_params: Sequence[SamplingParams],
        api_key: str | None = None,
    ) -> str | None:
        """The request's dedup key, or None when dedup is off or the request is not eligible."""
        if self.ttl == 0 or wants_fresh(headers):
            return None
        tenant = (api_key or "") if self.scope == "key" else ""
        return request_fingerprint(
            model=model, endpoint=endpoint, prompts=prompts, choice_params=choice_params, tenant=tenant
        )

    def key_of(self, generation: Generation, *, model: str) -> str | None:
        """`fingerprint` of an after-parse request."""
        return self.fingerprint(
            generation.headers,
            model=model,
            endpoint=generation.endpoint,
            prompts=generation.prompts,
            choice_params=generation.choice_params,
            api_key=generation.scope.get("state", {}).get("api_key"),
        )

    async def run(self, key: str | None, start: Callable[[], Awaitable[OutputSource]]) -> OutputSource:
        """The generation for `key`: joined, replayed, or started with `start()` (which submits to
        the engine). key None: `start()` itself. An exception from `start()` reaches the caller
        (e.g. a 503 before the stream opens), as without dedup."""
        if key is None:
            self.num_bypassed += 1
            return await start()
        flight = self._flights.get(key)
        if flight is not None:
            self.num_hits += 1
            return flight.listen()
        outputs = self._results.get(key)
        if outputs is not None:
            self.num_hits += 1
            return Flight.replay(key, outputs).listen()
        flight = self._flights[key] = Flight(key, on_done=self._settle, on_abandoned=self._abandon)
        handle = flight.listen()
        flight.task = task = asyncio.create_task(self._drive(flight, start), name=f"surge-dedup-{key[:12]}")
        self._tasks.add(task)
        task.add_done_callback(lambda task: self._flight_ended(flight, task))
        try:
            # Shielded: a creator that gives up must not cancel a flight others have joined.
            await asyncio.shield(flight.started)
        except BaseException:
            handle.close()
            raise
        if flight.start_error is not None:
            handle.close()
            raise flight.start_error
        return handle

    def holds(self, key: str) -> bool:
        """A generation of `key` is in flight, or its result kept, in this process."""
        return key in self._flights or self._results.get(key) is not None

    def lookup(self, key: str) -> SharedGeneration | None:
        """A reply that costs no new generation (a live flight or a result kept in this process),
        or None; for degraded service, where a generation is not an option. Never waits on Redis."""
        flight = self._flights.get(key)
        outputs = None if flight is not None else self._results.get(key)
        if flight is None and outputs is None:
            return None
        self.num_hits += 1
        return flight.listen() if flight is not None else Flight.replay(key, outputs or []).listen()

    async def aclose(self) -> None:
        """Cancel every flight (listeners get an error delta) and wait for the tasks to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- one flight's life ------------------------------------------------------------------

    async def _drive(self, flight: Flight, start: Callable[[], Awaitable[OutputSource]]) -> None:
        token: str | None = None  # our Redis lock, while we hold it
        try:
            claim = await self._claim(flight) if self._store is not None else None
            if claim is not None and claim.is_held_elsewhere:
                flight.mark_started()  # the creator's stream opens (keep-alives) while we wait
                claim = await self._wait_for_owner(flight)
            if claim is not None and claim.result is not None:
                self.num_hits += 1
                flight.cache_ttl = claim.ttl
                flight.extend(claim.result)
                return
            token = claim.token if claim is not None else None
            try:
                group = await start()
            except Exception as exc:
                if not flight.started.done():
                    flight.start_error = exc
                flight.fail(f"The generation could not start: {exc}")
                return
            self.num_misses += 1
            flight.mark_started()
            await self._relay(flight, group, token)
            if self._store is not None and flight.succeeded:
                store, outputs = self._store, flight.outputs
                if await self._quietly(store.publish(flight.key, token, outputs)):
                    token = None  # publish released it
        except Exception:
            log.exception("dedup flight %s failed", flight.request_id)
            flight.fail("The shared generation failed.")
        finally:
            flight.fail("The shared generation was cancelled.")  # no-op when it finished
            flight.mark_started()
            if token is not None and self._store is not None:
                await self._quietly(self._store.release(flight.key, token))

    async def _relay(self, flight: Flight, group: OutputSource, token: str | None) -> None:
        """Engine deltas to the flight until the last one; renew the lock meanwhile."""
        loop = asyncio.get_running_loop()
        renew_every = self._lease / 3
        renew_at = loop.time() + renew_every
        async with group:
            while not group.finished:
                outputs = await group.next_outputs(renew_every if token is not None else None)
                if outputs:
                    # The engine's outputs belong to this flight alone: relabel them in place
                    # rather than copying each one (this is the per-token path).
                    for out in outputs:
                        out.request_id = flight.request_id
                    flight.extend(outputs)
                if token is not None and self._store is not None and loop.time() >= renew_at:
                    renew_at = loop.time() + renew_every
                    await self._quietly(self._store.renew(flight.key, token))

    async def _claim(self, flight: Flight) -> Claim | None:
        """The Redis verdict for this key; None: Redis unusable, compute without the lock."""
        assert self._store is not None
        try:
            return await self._store.claim(flight.key, flight.request_id)
        except RedisUnavailable:
            return None
        except ValueError:
            log.exception("unreadable dedup result for %s; computing it again", flight.request_id)
            return None

    async def _wait_for_owner(self, flight: Flight) -> Claim | None:
        """Poll until the owner's result is stored or its lock is free (then ours); None: give up."""
        deadline = asyncio.get_running_loop().time() + self._max_wait
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(self._poll_interval)
            claim = await self._claim(flight)
            if claim is None or not claim.is_held_elsewhere:
                return claim
        log.info("dedup %s: the owner did not finish within %.0f s; computing it here", flight.key, self._max_wait)
        return None

    @staticmethod
    async def _quietly(operation: Awaitable[object]) -> bool:
        try:
            await operation
        except RedisUnavailable:
            return False
        return True

    def _settle(self, flight: Flight) -> None:
        """The flight has its last delta: later requests replay the result (if it succeeded)."""
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
        if flight.succeeded:
            self._results.put(flight.key, flight.outputs, flight.cache_ttl)

    def _flight_ended(self, flight: Flight, task: asyncio.Task[None]) -> None:
        # Also covers a task cancelled before its first step, whose `finally` never ran.
        self._tasks.discard(task)
        flight.fail("The shared generation was cancelled.")
        flight.mark_started()

    def _abandon(self, flight: Flight) -> None:
        """The last listener left early: forget the flight and abort its generation."""
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
        if flight.task is not None:
            flight.task.cancel()


class DedupLayer:
    """Identical deterministic requests share one generation (a flight, or a result kept for the TTL)."""

    def __init__(self, cache: DedupCache, *, model: str) -> None:
        self.cache = cache
        self.model = model

    async def __call__(self, generation: Generation, call_next: Handler) -> OutputSource:
        merged = generation.dedup_key  # a similar query's (middleware/dedup/similar.py), while it lasts
        if merged is None or not self.cache.holds(merged):
            merged = None
        key = merged if merged is not None else self.cache.key_of(generation, model=self.model)
        return await self.cache.run(key, lambda: call_next(generation))
