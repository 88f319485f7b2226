"""Sizes on the command line: `512MiB`, `2GB`, `1000000` (bytes) or `50%` (a share of a budget)."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def parse_size(text: str) -> tuple[int, float]:
    """(bytes, share): one of the two is set, the other 0; `50%` is (0, 0.5)."""
    value = text.strip().lower()
    if value.endswith("%"):
        try:
            share = float(value[:-1]) / 100
        except ValueError:
            raise ValueError(f"not a size: {text!r} (e.g. 50% or 512MiB)") from None
        if not 0 <= share <= 100:  # a pool larger than the slot cache is allowed, not an absurd one
            raise ValueError(f"a share of {text!r} is out of range")
        return 0, share
    match = _SIZE.fullmatch(value)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 50% or 512MiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2)]), 0.0
