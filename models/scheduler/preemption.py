"""Preemption: which running sequence gives its slot to a waiting one of a more important tier, or
of the light lane past the heavy lane's share (models/scheduler/lanes.py). Pure policy; the
scheduler does the moving (models/scheduler/scheduler.py).

Only a strictly more important tier preempts (the body's `priority` orders a tier's own queue and
never takes a running sequence's slot), and the victim is the least important running sequence,
the latest to arrive of its tier: the least work lost, and the oldest streams of a tier keep
going. A preempted sequence resumes by computing again its prompt and what it had generated
(the prefix cache gives back most of it) and then samples its next token: its client sees a
longer pause and nothing else, its tokens unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from models.scheduler.sequence import Sequence


def victim_for(
    running: Seq[Sequence], head: Sequence, by_tier: bool = True, heavy_share: int | None = None
) -> Sequence | None:
    """The running sequence `head` may take the place of, or None. `by_tier`: preemption by tier
    is on; `heavy_share`: lanes are on (models/scheduler/lanes.py) and heavy sequences may hold
    that many slots while a light one waits: past it, a light `head` takes the latest heavy one of
    its own tier or a less important one."""
    if not running:
        return None
    if by_tier:
        victim = max(running, key=lambda seq: (seq.tier, seq.arrival_order))
        if victim.tier > head.tier:
            return victim
    if heavy_share is None or head.heavy or sum(seq.heavy for seq in running) <= heavy_share:
        return None
    heavy = [seq for seq in running if seq.heavy and seq.tier >= head.tier]
    return max(heavy, key=lambda seq: (seq.tier, seq.arrival_order), default=None)
