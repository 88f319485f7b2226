"""Who runs first and who is shed: the server's tier, then the client's priority within it.

A key's tier comes from the keys file (lower = more important; keys without one, and every
request when auth is off, are tier 0). Shedding at level 4 and level 3's canned replies go by the
tier alone. The body's `priority` (vLLM's field: lower runs first) only orders requests within
their tier: it is bounded, and negative values (ahead of the tier's ordinary requests) are for the
keys the keys file allows them (`min_priority`), so no client can reach another tier's place.
"""

from __future__ import annotations

from middleware.errors import invalid_request

# The body's priority lies within +-MAX_PRIORITY (the schema's bound).
MAX_PRIORITY = 1_000_000
# Engine priorities of one tier: every body priority of tier t sorts after all of tier t - 1's.
_TIER_SPAN = 2 * MAX_PRIORITY + 1


def engine_priority(tier: int, priority: int) -> int:
    """The engine's queue order (lower first): the tier, then the body's priority within it."""
    return tier * _TIER_SPAN + priority


def check_priority(priority: int, min_priority: int) -> None:
    """A 400 when the body asks to run ahead of what its key may."""
    if priority < min_priority:
        allowed = "may not be negative" if min_priority == 0 else f"may not be below {min_priority} for this API key"
        message = f"priority {priority} {allowed}: a request can lower its own priority, not raise it."
        raise invalid_request(message, param="priority")
