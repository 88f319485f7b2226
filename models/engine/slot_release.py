"""When free slots' K/V memory goes back to the system (the CPU's reserved slot cache,
models/kv/cache.py; elsewhere releasing is a no-op).

Slots are kept compact: the running sequences hold slots [0, num_slots), so every slot from
`num_slots` up is free once the step's moves have run. A free slot keeps the pages its last
sequences wrote until released, and a released slot costs page faults when it is next written
(about 1.5 us a page for memory freed moments before, on the VM measured in docs/engine.md). So:
- busy, at most every `busy_interval_s`: the slots above this step's count, as far up as any
  sequence has reached since the last release: memory follows a load that has fallen for good,
  while a batch that merely churns (one finishing, the next arriving) refaults at most once per
  interval;
- idle, after `idle_delay_s` with nothing to run: every slot. A lone client's next request pays
  its own prompt's faults, a few milliseconds against a prefill of the same tokens.
- `at_once` (where the K/V budget counts tokens, SchedulerConfig.max_kv_tokens): every step, the
  free slots and, in each slot a shorter sequence moved into, the positions past its length. The
  memory the slots hold then stays within what the running sequences were admitted for, which
  the budget promised; it costs a few faults a request.

The C heap follows the idle rule too, where the engine's process keeps freed pages for the next
step (models/runner/heap.py): they go back with the slots once idle.

Pure bookkeeping with an injectable clock; the engine calls it and owns the runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from models.runner import heap
from models.runner.protocol import Runner
from models.scheduler.output import BlockCopy, SlotMove
from models.scheduler.sequence import Sequence as SlotSequence

BUSY_INTERVAL_S = 10.0
IDLE_DELAY_S = 1.0


class SlotRelease:
    def __init__(
        self,
        runner: Runner,
        num_slots: int,
        clock: Callable[[], float] = time.monotonic,
        busy_interval_s: float = BUSY_INTERVAL_S,
        idle_delay_s: float = IDLE_DELAY_S,
        at_once: bool = False,
    ) -> None:
        self.runner = runner
        self.at_once = at_once
        self.clock = clock
        self.busy_interval_s = busy_interval_s
        self.idle_delay_s = idle_delay_s
        self._high = num_slots  # slots [0, _high) may hold memory; a fresh cache may have any of them
        self._last = clock()
        # The heap's purge where this process keeps freed pages (a CPU engine's child process):
        # the first idle (after warmup) gives back what loading and warming up freed.
        device = getattr(getattr(runner, "device", None), "type", None)
        self._give_back = heap.give_back if device == "cpu" and heap.is_kept() else None
        self._heap_held = self._give_back is not None  # steps ran since the heap last gave pages back

    def after_moves(self, moves: Sequence[SlotMove | BlockCopy], running: Sequence[SlotSequence]) -> None:
        """A step's moves have run; `running[i]` holds slot i (the scheduler's list)."""
        num_slots = len(running)
        self._heap_held = self._give_back is not None
        if self.at_once:
            # Each slot a sequence was moved into: the positions past its own, left by a longer one.
            moved_into = {move.dst for move in moves if isinstance(move, SlotMove) and move.dst < num_slots}
            for slot in sorted(moved_into):
                self.runner.release_tail(slot, running[slot].num_computed_tokens)
        if num_slots >= self._high:
            self._high = num_slots
        elif self.at_once or self.clock() - self._last >= self.busy_interval_s:
            self._release(num_slots)

    def idle_wait(self) -> float | None:
        """How long the idle engine may wait for work before `idle()` is due; None: nothing to release."""
        return self.idle_delay_s if self._high or self._heap_held else None

    def idle(self) -> None:
        """Nothing has run for `idle_delay_s` and no slot holds a sequence."""
        self._release(0)
        if self._give_back is not None and self._heap_held:
            self._give_back()
            self._heap_held = False

    def _release(self, num_slots: int) -> None:
        if num_slots < self._high:
            self.runner.release_slots(num_slots, self._high)
        self._high = num_slots
        self._last = self.clock()
