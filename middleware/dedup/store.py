"""Where the dedup cache keeps finished results: in process, and in Redis for other replicas.

A result is the whole sequence of deltas one generation produced (`RequestOutput`s: text,
token ids, logprobs, finish reason), so a streamed and a non-streamed request can both be
rendered from it. Only successful generations are stored; that is the caller's rule.

- `LocalResults`: a TTL map with a size bound. Every entry has the same TTL, so insertion order
  is expiry order and the oldest entry is the one to evict.
- `RedisDedupStore`: per fingerprint, a result key and an efficiency lock,
  `surge:dedup:{<fingerprint>}:result` and `...:lock` (the braces keep both in one cluster
  slot, so one script may touch both). Each operation is one Lua script, one round trip:
  `claim` returns the stored result, or takes the lock (`SET NX PX`, random token), or says
  someone else holds it; `renew`, `release` and `publish` touch the lock only with its token,
  so a replica never frees a lock it lost. A crashed owner stops renewing, and its lock expires
  within one lease. Every method raises `RedisUnavailable` when Redis does not answer in time;
  the dedup layer then computes the result itself (dedup is never needed for correctness).

Knows nothing of HTTP or of the engine beyond its output type.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from middleware.redis import RedisBackend
from models import FinishReason, RequestOutput, TokenLogprob

KEY_PREFIX = "surge:dedup:"
FORMAT_VERSION = 1

# KEYS result, lock; ARGV token, lease ms -> {1, result, pttl} | {2} (lock taken) | {0} (held)
_CLAIM = """
local result = redis.call('GET', KEYS[1])
if result then return {1, result, redis.call('PTTL', KEYS[1])} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {2} end
return {0}
"""

# KEYS lock; ARGV token, lease ms -> 1 renewed, 0 not ours any more
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# KEYS lock; ARGV token -> 1 released, 0 not ours
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS result, lock; ARGV token ('' without the lock), result, ttl ms. Store, then free our lock.
_PUBLISH = """
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
"""


class LocalResults:
    """Finished results by fingerprint, each kept for `ttl` seconds of `clock`.

    Bounded twice, oldest evicted first: at most `max_entries` results, and `max_tokens` tokens
    in all, where each logprob alternative counts as one more token (an alternative costs about a
    third of a token's deltas: docs/engine.md, measurements).
    """

    def __init__(
        self, *, ttl: float, max_entries: int, max_tokens: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_entries < 1 or max_tokens < 1:
            raise ValueError("max_entries and max_tokens must be at least 1")
        self.ttl = ttl
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._clock = clock
        # key -> (expires at, outputs, tokens)
        self._entries: OrderedDict[str, tuple[float, list[RequestOutput], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> list[RequestOutput] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() >= entry[0]:
            self._pop(key)
            return None
        return entry[1]

    def put(self, key: str, outputs: list[RequestOutput], ttl: float | None = None) -> None:
        """Keep `outputs` for `ttl` seconds (default: the full TTL; less for a result found in Redis)."""
        now = self._clock()
        ttl = self.ttl if ttl is None else min(ttl, self.ttl)
        num_tokens = max(1, sum(len(out.token_ids) + sum(len(lp.top) for lp in out.logprobs) for out in outputs))
        if ttl <= 0 or num_tokens > self.max_tokens:
            return
        self._pop(key)
        self._entries[key] = (now + ttl, outputs, num_tokens)
        self.num_tokens += num_tokens
        # NOTE: a shortened TTL (from Redis) can sit behind a longer one; it then lives a little
        # longer than Redis's copy, at most until the entries before it expire. Harmless.
        while self._entries:
            oldest, (expires, _, _) = next(iter(self._entries.items()))
            if len(self._entries) <= self.max_entries and self.num_tokens <= self.max_tokens and expires > now:
                break
            self._pop(oldest)

    def _pop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.num_tokens -= entry[2]


@dataclass(frozen=True, slots=True)
class Claim:
    """What `claim` found: a stored result, the lock (our token), or neither (someone holds it)."""

    result: list[RequestOutput] | None = None
    ttl: float = 0.0  # seconds the stored result has left
    token: str | None = None

    @property
    def is_held_elsewhere(self) -> bool:
        return self.result is None and self.token is None


class RedisDedupStore:
    def __init__(self, backend: RedisBackend, *, ttl: float, lease: float) -> None:
        if ttl <= 0 or lease <= 0:
            raise ValueError("the dedup TTL and lease must be positive")
        self.ttl = ttl
        self.lease = lease
        self._backend = backend
        client = backend.client
        self._claim = client.register_script(_CLAIM)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._publish = client.register_script(_PUBLISH)

    async def claim(self, key: str, request_id: str) -> Claim:
        token = secrets.token_hex(16)
        reply = await self._run(self._claim, _keys(key), [token, _ms(self.lease)])
        if reply[0] == 2:
            return Claim(token=token)
        if reply[0] == 1:
            return Claim(result=decode_result(reply[1], request_id), ttl=max(0, int(reply[2])) / 1000)
        return Claim()

    async def renew(self, key: str, token: str) -> bool:
        return bool(await self._run(self._renew, _keys(key)[1:], [token, _ms(self.lease)]))

    async def release(self, key: str, token: str) -> bool:
        return bool(await self._run(self._release, _keys(key)[1:], [token]))

    async def publish(self, key: str, token: str | None, outputs: Sequence[RequestOutput]) -> None:
        """Store the result for `ttl`, then release the lock if `token` still holds it."""
        await self._run(self._publish, _keys(key), [token or "", encode_result(outputs), _ms(self.ttl)])

    async def _run(self, script: AsyncScript, keys: list[str], args: Sequence[str | int | bytes]) -> Any:
        async def operation(client: aioredis.Redis) -> Any:
            return await script(keys=keys, args=args, client=client)

        return await self._backend.call(operation)


def _keys(key: str) -> list[str]:
    return [f"{KEY_PREFIX}{{{key}}}:result", f"{KEY_PREFIX}{{{key}}}:lock"]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


# --- the serialized form --------------------------------------------------------------------
# {"v": 1, "num_prompt_tokens": P, "num_cached_tokens": C (absent in results stored before it),
#  "deltas": [[text, [token ids], [[token id, logprob, [[alt id, logprob], ...]], ...], finish], ...]}


def encode_result(outputs: Sequence[RequestOutput]) -> bytes:
    deltas = [
        [
            out.text,
            out.token_ids,
            [[lp.token_id, lp.logprob, [list(alt) for alt in lp.top]] for lp in out.logprobs],
            None if out.finish_reason is None else out.finish_reason.value,
        ]
        for out in outputs
    ]
    num_prompt_tokens = outputs[0].num_prompt_tokens if outputs else 0
    num_cached_tokens = outputs[-1].num_cached_tokens if outputs else 0
    head = {"v": FORMAT_VERSION, "num_prompt_tokens": num_prompt_tokens, "num_cached_tokens": num_cached_tokens}
    return json.dumps({**head, "deltas": deltas}).encode()


def decode_result(payload: bytes, request_id: str) -> list[RequestOutput]:
    """The stored deltas as outputs of `request_id`; ValueError if the payload is not ours."""
    try:
        data = json.loads(payload)
        if data["v"] != FORMAT_VERSION:
            raise ValueError(f"dedup result format {data['v']} is not {FORMAT_VERSION}")
        num_prompt_tokens = int(data["num_prompt_tokens"])
        num_cached_tokens = int(data.get("num_cached_tokens", 0))
        outputs, num_output_tokens = [], 0
        for text, token_ids, logprobs, finish in data["deltas"]:
            num_output_tokens += len(token_ids)
            outputs.append(
                RequestOutput(
                    request_id,
                    text,
                    token_ids,
                    num_prompt_tokens,
                    num_output_tokens,
                    [TokenLogprob(tid, lp, tuple((alt, alt_lp) for alt, alt_lp in top)) for tid, lp, top in logprobs],
                    None if finish is None else FinishReason(finish),
                    num_cached_tokens=num_cached_tokens,
                )
            )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a dedup result: {exc!r}") from exc
    if not outputs or not outputs[-1].finished:
        raise ValueError("a dedup result must end with a finished delta")
    return outputs
