"""The accepted API keys now, and what each may do: one snapshot, replaced whole when the keys file
changes.

`KeySet` is one moment's keys: every accepted key (`--api-key` and the keys file's) and, from the
keys file, each key's tier, lowest body priority, rate limits and concurrency limit. It never
changes. `KeyRing.current` is the set in force: the auth layer reads it once per request and hands
that set to the later per-key layers (rate limit, concurrency) in `scope["state"]["key_set"]`, so a
reload, one assignment, gives every request the old set or the new one, never half of each, and a
removed key is refused from the next request on (requests already past the door run to their end).

`KeysFileWatcher` reloads the keys file: `check()` when its path's signature (device, inode,
size, mtime) has changed since the last load, `reload()` whatever it is (SIGHUP). It stats the
path, not an open file, so a Kubernetes Secret volume's symlink swap is seen. A file that does not
parse, or cannot be read, leaves the keys in use and is an ERROR naming the problem, never the
file's lines (middleware/keys_file.py). Nothing per key outlives its snapshot here; the layers'
own per-key state (buckets, in-flight counts, fair shares) is dropped once a key is idle.
Must not know `app/`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from middleware.keys_file import KeysFile, KeysFileError, Limits, load_keys_file, per_key_limits

log = logging.getLogger("surge.keys")

# A file rewritten while it was read (an editor saving in place) is read again, this many times.
MAX_READS = 3

Signature = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns of what the path names


@dataclass(frozen=True, slots=True)
class KeySet:
    """Every accepted key, as the Authorization header carries it, and each key's settings."""

    keys: tuple[bytes, ...] = ()  # empty: auth is off
    tiers: Mapping[bytes, int] = field(default_factory=dict)
    min_priorities: Mapping[bytes, int] = field(default_factory=dict)
    rate_limits: Mapping[str, Limits] = field(default_factory=dict)  # absent: the server-wide limits
    concurrency_limits: Mapping[str, int] = field(default_factory=dict)  # absent: --max-concurrent-per-key
    merge_similar: Mapping[str, float] = field(default_factory=dict)  # absent: --merge-similar

    def __post_init__(self) -> None:
        if not set(self.tiers) | set(self.min_priorities) <= set(self.keys):
            raise ValueError("every key with a priority tier or min_priority must be an accepted API key")

    @classmethod
    def of(
        cls,
        api_keys: Sequence[str],
        priority_tiers: Mapping[str, int] | None = None,
        min_priorities: Mapping[str, int] | None = None,
    ) -> KeySet:
        for key in api_keys:
            if not isinstance(key, str) or not key.strip():
                raise ValueError("API keys must be non-empty strings")
        return cls(
            tuple(dict.fromkeys(key.encode() for key in api_keys)),
            {key.encode(): tier for key, tier in (priority_tiers or {}).items()},
            {key.encode(): floor for key, floor in (min_priorities or {}).items()},
        )

    @classmethod
    def from_file(cls, api_keys: Sequence[str], keys_file: KeysFile | None, default_limits: Limits) -> KeySet:
        """`--api-key`'s keys (the server-wide settings) and the keys file's, with theirs."""
        if keys_file is None:
            return cls.of(api_keys)
        keys = cls.of((*api_keys, *keys_file.keys), keys_file.priority_tiers(), keys_file.min_priorities())
        return cls(
            keys.keys,
            keys.tiers,
            keys.min_priorities,
            per_key_limits(keys_file, default_limits),
            keys_file.concurrency_limits(),
            keys_file.merge_thresholds(),
        )


class KeyRing:
    """The key set in force; `current` is replaced whole, never changed in place."""

    def __init__(self, keys: KeySet) -> None:
        self.current = keys


class KeysFileWatcher:
    """Reloads `path` into `ring`, from `check()` (a poll) or `reload()` (a signal); thread-safe."""

    def __init__(self, ring: KeyRing, path: str, *, api_keys: Sequence[str], default_limits: Limits) -> None:
        """The ring already holds the file as it is now (it was checked at start-up)."""
        self.ring = ring
        self.path = path
        self._api_keys = tuple(api_keys)
        self._default_limits = default_limits
        self._lock = threading.Lock()
        self._loaded = _signature(path)  # what the keys in use were read from; None: unknown
        # The signature (None: unreadable) whose failure was logged last, in a tuple; None: no failure.
        self._failed_on: tuple[Signature | None] | None = None

    def check(self) -> bool:
        """Reload when the file is not the one loaded last; True when the keys were replaced."""
        with self._lock:
            signature = _signature(self.path)
            if signature is not None and signature == self._loaded:
                return False
            return self._load(signature, is_asked=False)

    def reload(self) -> bool:
        """Reload now, changed or not (SIGHUP); True when the keys were replaced."""
        with self._lock:
            return self._load(_signature(self.path), is_asked=True)

    def _load(self, signature: Signature | None, *, is_asked: bool) -> bool:
        for _ in range(MAX_READS):
            try:
                keys_file = load_keys_file(self.path)
            except KeysFileError as exc:
                # Logged once per version of the file when polled; every time when asked for.
                if is_asked or self._failed_on != (signature,):
                    log.error("%s; keeping the %d keys in use", exc, len(self.ring.current.keys))
                self._failed_on = (signature,)
                return False
            read = _signature(self.path)
            if read == signature:
                break
            signature = read  # rewritten while it was read: read it again
        else:
            log.warning("keys file %s: changing while it is read; keeping the keys in use for now", self.path)
            return False
        old = set(self.ring.current.keys)
        new = KeySet.from_file(self._api_keys, keys_file, self._default_limits)
        self.ring.current = new  # NOTE: the one write readers see: the old set or the new one, never a mix
        self._loaded = signature
        self._failed_on = None
        added, removed = len(set(new.keys) - old), len(old - set(new.keys))
        log.info("keys file %s reloaded: %d keys (%d added, %d removed)", self.path, len(new.keys), added, removed)
        return True


def _signature(path: str) -> Signature | None:
    """What the path names now (symlinks followed), or None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
