"""Similar queries share one generation (opt-in, per key): dedup by meaning, not by bytes.

A request is a candidate when merging is on for its key (`--merge-similar`, or the key's
`merge_similar` in the keys file: a cosine similarity from 0, off, to 1), it is eligible for dedup
(deterministic, one choice of one prompt: middleware/dedup/cache.py) and its route gave a query
(the last user turn's text: app/generation/similar.py). Its query is embedded by the served
embedding model; among the queries of the same *group* (same API key, served model, endpoint,
sampling parameters and context: everything but the query, which must match exactly) still in
flight or answered within the dedup TTL, the most similar one at or above the threshold gives its
dedup key to this request, and the dedup layer inside joins that generation or replays its result.
Otherwise this request's query is recorded under its own dedup key for later ones.

Risks, why it is off by default (docs/traffic.md#merging-similar-queries): two questions close
in embedding space can still want different answers ("the capital of France" and "... of
Germany" are near each other for a weak encoder); a merged request gets the answer to the first
wording, its usage counts that generation's tokens. Never across keys: a group is one key's.

Per process: the index lives in this replica (results kept in Redis by dedup are found only by
exact keys). Bounded: `max_groups` groups, `max_per_group` queries each, oldest out first; entries
expire with the dedup TTL. The embedding is the app's callable; a failure there (queue full,
no model) skips merging for that request, never fails it.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from middleware.dedup.cache import DedupCache, request_fingerprint
from middleware.generation import Generation, Handler
from models import OutputSource

log = logging.getLogger("surge.dedup")

Embed = Callable[[str], Awaitable[Sequence[float] | None]]

DEFAULT_MAX_GROUPS = 4096
DEFAULT_MAX_PER_GROUP = 64


@dataclass(slots=True)
class _Entry:
    vector: Sequence[float]
    key: str
    expires_at: float


class SimilarQueries:
    """Recent queries' unit vectors by group, each with the dedup key of its generation."""

    def __init__(
        self,
        *,
        ttl: float,
        max_groups: int = DEFAULT_MAX_GROUPS,
        max_per_group: int = DEFAULT_MAX_PER_GROUP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl
        self._max_groups = max_groups
        self._max_per_group = max_per_group
        self._clock = clock
        self._groups: OrderedDict[str, list[_Entry]] = OrderedDict()
        self.num_checked = 0  # candidates embedded and compared
        self.num_merged = 0  # of them, given a similar generation

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._groups.values())

    def find(self, group: str, vector: Sequence[float], threshold: float) -> tuple[str, float] | None:
        """The dedup key of the most similar live query of `group` at `threshold` or above, and its similarity."""
        entries = self._live(group)
        best: tuple[str, float] | None = None
        for entry in entries:
            similarity = sum(map(operator.mul, entry.vector, vector))
            if similarity >= threshold and (best is None or similarity > best[1]):
                best = (entry.key, similarity)
        return best

    def add(self, group: str, vector: Sequence[float], key: str) -> None:
        entries = self._live(group)
        entries.append(_Entry(vector, key, self._clock() + self._ttl))
        del entries[: -self._max_per_group]
        self._groups[group] = entries
        self._groups.move_to_end(group)
        while len(self._groups) > self._max_groups:
            self._groups.popitem(last=False)

    def _live(self, group: str) -> list[_Entry]:
        now = self._clock()
        entries = [entry for entry in self._groups.get(group, ()) if entry.expires_at > now]
        if not entries:
            self._groups.pop(group, None)
        return entries


def threshold_of(generation: Generation, default: float) -> float:
    """The key's `merge_similar` (keys file), else the server's (auth off: one tenant, the server's)."""
    state = generation.scope.get("state", {})
    api_key = state.get("api_key")
    if api_key is None:
        return default
    key_set = state.get("key_set")
    own = key_set.merge_similar.get(api_key) if key_set is not None else None
    return default if own is None else own


class MergeSimilarLayer:
    """Give a request the dedup key of a similar query's generation, where merging is on."""

    def __init__(self, cache: DedupCache, index: SimilarQueries, embed: Embed, *, model: str, default: float) -> None:
        self.cache = cache
        self.index = index
        self._embed = embed
        self._model = model
        self._default = default

    async def __call__(self, generation: Generation, call_next: Handler) -> OutputSource:
        threshold = threshold_of(generation, self._default)
        if threshold <= 0 or generation.similar is None:
            return await call_next(generation)
        key = self.cache.key_of(generation, model=self._model)
        query = generation.similar() if key is not None else None
        if key is None or query is None:
            return await call_next(generation)
        try:
            vector = await self._embed(query.text)
        except Exception as exc:  # the embedding's failure costs the merge, never the request
            log.warning("similar-query merging skipped: the query could not be embedded (%r)", exc)
            vector = None
        if vector is None:
            return await call_next(generation)
        group = self._group(generation, query.context)
        self.index.num_checked += 1
        found = self.index.find(group, vector, threshold)
        if found is not None and found[0] != key and self.cache.holds(found[0]):
            generation.dedup_key = found[0]
            self.index.num_merged += 1
            log.info("merged a similar query (similarity %.3f)", found[1])
        else:
            self.index.add(group, vector, key)
        return await call_next(generation)

    def _group(self, generation: Generation, context: str) -> str:
        """One key's requests that differ at most by their query: key, model, endpoint, parameters, context."""
        api_key = generation.scope.get("state", {}).get("api_key") or ""
        params = request_fingerprint(
            model=self._model,
            endpoint=generation.endpoint,
            prompts=[[]],
            choice_params=generation.choice_params,
            tenant=api_key or "-",
        )
        return hashlib.sha256(f"{params}\n{context}".encode()).hexdigest()
