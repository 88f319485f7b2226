"""torch's intra-op threads on CPU, chosen per engine step.

Decode steps run on `decode` threads (1 by default: a second thread fights the HTTP process and
the load client for the cores and slows every step). A burst of new prompts is different: while the
engine prefills it, the HTTP process has already handed the requests over and waits for first
tokens, so the other cores are idle. A step that computes at least `min_prompt_tokens` prompt
tokens runs on `prefill` threads, where a big step goes nearly twice as fast on two cores as on one
(docs/engine.md, measurements); the next ordinary step goes back to `decode`. Switching costs a `torch.set_num_threads`
call, made only when the count changes.
"""

from __future__ import annotations

import torch

from models.cpus import prefill_thread_count

# A step with fewer prompt tokens than this is a decode step with a new request or two riding
# along: its matmuls are too small for a second thread to pay for the contention.
DEFAULT_MIN_PROMPT_TOKENS = 128


class StepThreads:
    def __init__(self, decode: int, prefill: int, min_prompt_tokens: int = DEFAULT_MIN_PROMPT_TOKENS) -> None:
        if decode < 1 or prefill < 1:
            raise ValueError("thread counts must be positive")
        if min_prompt_tokens < 1:
            raise ValueError("min_prompt_tokens must be positive")
        self.decode = decode
        self.prefill = prefill
        self.min_prompt_tokens = min_prompt_tokens
        # Unknown until the first step sets it: torch's count is per thread, and this object is
        # built on the loading thread, not the engine's.
        self.current: int | None = None

    def before_step(self, num_prompt_tokens: int) -> None:
        """Set the thread count for a step that computes `num_prompt_tokens` prompt tokens."""
        wanted = self.prefill if num_prompt_tokens >= self.min_prompt_tokens else self.decode
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted


def step_threads(device: torch.device, num_threads: int, prefill_threads: int) -> StepThreads | None:
    """The policy for a model on `device`, or None where there is nothing to switch: on a GPU
    (CPU threads only launch kernels), with torch's own thread count (`num_threads` 0), or with
    `prefill_threads` equal to `num_threads`. `prefill_threads` 0: every CPU this process may use."""
    if device.type != "cpu" or num_threads < 1:
        return None
    prefill = prefill_thread_count(num_threads, prefill_threads)
    return StepThreads(num_threads, prefill) if prefill > num_threads else None
