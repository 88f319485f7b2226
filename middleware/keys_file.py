"""The `--keys-file`: API keys with optional per-key rate limits and a priority tier.

A YAML or JSON mapping from key to settings (or to nothing):

    sk-team-a: {rpm: 600, tpm: 200000, tier: 0}
    sk-batch:  {tpm: 50000, tier: 2}
    sk-ops:    {tier: 0, min_priority: -10}
    sk-plain:                         # a valid key with the server-wide limits

`rpm` and `tpm` override `--rate-limit-rpm` / `--rate-limit-tpm` for that key (0 = unlimited);
`tier` is a priority tier for load shedding (lower = more important; 0 without one);
`min_priority` (0 or negative, default 0) is the lowest body `priority` the key may send, to run
ahead of its tier's ordinary requests (middleware/admission/priority.py); `max_concurrent`
(sequences in flight: prompts x n of each request) overrides `--max-concurrent-per-key` (0 = no
limit); `merge_similar` (a cosine similarity, 0 = off) overrides `--merge-similar` for the key's
requests (middleware/dedup/similar.py). Every key in the file is a
valid API key. The file is checked once at start-up; any problem is a `KeysFileError` that
names the file, the key and the field. Must not know `app/`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from middleware.admission.priority import MAX_PRIORITY

FIELDS = ("rpm", "tpm", "tier", "min_priority", "max_concurrent", "merge_similar")
_INTEGER_FIELDS = FIELDS[:-1]


class KeysFileError(ValueError):
    """The keys file is missing, unreadable or invalid."""


@dataclass(frozen=True, slots=True)
class KeyEntry:
    key: str
    rpm: int | None = None  # None: the server-wide --rate-limit-rpm
    tpm: int | None = None  # None: the server-wide --rate-limit-tpm
    tier: int | None = None  # None: no tier of its own
    min_priority: int = 0  # the lowest body priority the key may send
    max_concurrent: int | None = None  # sequences in flight; None: --max-concurrent-per-key; 0: no limit
    merge_similar: float | None = None  # similar-query merging's threshold; None: --merge-similar; 0: off


@dataclass(frozen=True, slots=True)
class KeysFile:
    path: str
    entries: tuple[KeyEntry, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(entry.key for entry in self.entries)

    def priority_tiers(self) -> dict[str, int]:
        return {entry.key: entry.tier for entry in self.entries if entry.tier is not None}

    def concurrency_limits(self) -> dict[str, int]:
        return {entry.key: entry.max_concurrent for entry in self.entries if entry.max_concurrent is not None}

    def merge_thresholds(self) -> dict[str, float]:
        return {entry.key: entry.merge_similar for entry in self.entries if entry.merge_similar is not None}

    def min_priorities(self) -> dict[str, int]:
        return {entry.key: entry.min_priority for entry in self.entries if entry.min_priority}


def load_keys_file(path: str | Path) -> KeysFile:
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysFileError(f"keys file {source}: cannot read it ({exc})") from None
    try:
        data = json.loads(text) if source.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise KeysFileError(f"keys file {source}: not valid {_format(source)} ({_where(exc)})") from None
    return KeysFile(str(source), parse_keys(data, str(source)))


def parse_keys(data: object, source: str = "keys file") -> tuple[KeyEntry, ...]:
    if not isinstance(data, Mapping) or not data:
        raise KeysFileError(f"{source}: expected a non-empty mapping of API keys to their settings")
    return tuple(_entry(key, value, source) for key, value in data.items())


def _entry(key: object, value: object, source: str) -> KeyEntry:
    if not isinstance(key, str):
        raise KeysFileError(f"{source}: key {key!r} is not a string (quote it)")
    if not key or key != key.strip() or any(c.isspace() for c in key):
        raise KeysFileError(f"{source}: key {_masked(key)} is empty or contains whitespace")
    if value is None:
        return KeyEntry(key)
    label = f"{source}: key {_masked(key)}"
    if not isinstance(value, Mapping):
        raise KeysFileError(f"{label}: expected a mapping with {', '.join(FIELDS)} (or nothing)")
    unknown = sorted(str(name) for name in value if name not in FIELDS)
    if unknown:
        raise KeysFileError(f"{label}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(FIELDS)}")
    for name in _INTEGER_FIELDS:
        field_value = value.get(name)
        # bool is an int in Python; `rpm: yes` is a mistake, not 1.
        if field_value is not None and (not isinstance(field_value, int) or isinstance(field_value, bool)):
            raise KeysFileError(f"{label}: {name} must be an integer, not {field_value!r}")
    for name in ("rpm", "tpm", "max_concurrent"):
        if value.get(name) is not None and value[name] < 0:
            raise KeysFileError(f"{label}: {name} must be 0 (unlimited) or positive")
    min_priority = value.get("min_priority") or 0
    if not -MAX_PRIORITY <= min_priority <= 0:
        raise KeysFileError(f"{label}: min_priority must be 0 or negative, down to {-MAX_PRIORITY}")
    merge = value.get("merge_similar")
    if merge is not None and (isinstance(merge, bool) or not isinstance(merge, int | float) or not 0 <= merge <= 1):
        raise KeysFileError(f"{label}: merge_similar must be a number from 0 (off) to 1, not {merge!r}")
    return KeyEntry(
        key,
        value.get("rpm"),
        value.get("tpm"),
        value.get("tier"),
        min_priority,
        value.get("max_concurrent"),
        float(merge) if merge is not None else None,
    )


def _where(exc: json.JSONDecodeError | yaml.YAMLError) -> str:
    """What is wrong and where, never the line itself: PyYAML's message quotes the offending
    line, which in this file is an API key."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "invalid YAML"
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _masked(key: str) -> str:
    # Error messages end up in logs; show enough of a key to find it, not the secret.
    return repr(key[:6] + "...") if len(key) > 8 else repr(key[:2] + "...")


def _format(source: Path) -> str:
    return "JSON" if source.suffix.lower() == ".json" else "YAML"


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int = 0  # requests per minute; 0 = unlimited
    tpm: int = 0  # tokens (prompt + max_tokens) per minute; 0 = unlimited

    def __post_init__(self) -> None:
        if self.rpm < 0 or self.tpm < 0:
            raise ValueError("rate limits must be 0 (unlimited) or positive")

    @property
    def is_limited(self) -> bool:
        return self.rpm > 0 or self.tpm > 0


def per_key_limits(keys: KeysFile, default: Limits) -> dict[str, Limits]:
    """Each key's rate limits: its own `rpm` / `tpm` where the keys file gives them, else `default`."""
    return {
        entry.key: Limits(
            default.rpm if entry.rpm is None else entry.rpm, default.tpm if entry.tpm is None else entry.tpm
        )
        for entry in keys.entries
    }
