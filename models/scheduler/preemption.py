"""Preemption by tier: which running sequence gives its slot to a waiting one of a more important
tier. Pure policy; the scheduler does the moving (models/scheduler/scheduler.py).

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


def victim_for(running: Seq[Sequence], head: Sequence) -> Sequence | None:
    """The running sequence `head` may take the place of, or None."""
    if not running:
        return None
    victim = max(running, key=lambda seq: (seq.tier, seq.arrival_order))
    return victim if victim.tier > head.tier else None
