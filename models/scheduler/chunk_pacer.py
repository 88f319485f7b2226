"""How many tokens of a long prompt a step may take while other sequences decode, by time rather
than tokens.

A fixed token cap is the wrong unit: 512 prompt tokens are a few milliseconds on a GPU and seconds
on two CPU cores (a 0.37B model in bfloat16 prefills ~200 tokens a second at 8k of context on a
Zen 4 VM, so every decoding stream waited 2.5 s a token while an 8k prompt went through in 512-token
chunks). The pacer learns what a prompt token costs from the steps the engine has run, and caps a
long prompt's chunk at what fits in `target_seconds` on top of the decode rows: streams keep a
steady pace whatever the machine, and a fast one keeps the token cap
(config.max_prompt_chunk_while_decoding) as its only limit. Prompts within that cap are not paced
(models/scheduler/scheduler.py): a burst of chat prompts still starts in one step.

The cost model is linear: a step's seconds = the decode rows' share + seconds a prompt token x
prompt tokens. Decode-only steps give the first term (its recent average); steps with a prompt give
the second, as a ratio of decayed sums of the prompt's seconds and tokens, so a 20-token chat prompt
(whose fixed costs dwarf its tokens) weighs little beside a 512-token chunk. A token's cost grows
with the context it attends to, and the decay follows it as a long prompt goes on.

No clock: the engine hands it each step's measured seconds (models/engine/core.py); tests hand it
made-up ones.
"""

from __future__ import annotations

DECAY = 0.5  # each step's weight in the averages against the steps before it: a few steps' memory
GRAIN = 32  # caps are whole multiples of this many tokens: a handful of shapes for the kernels' caches


class ChunkPacer:
    def __init__(self, target_seconds: float, max_tokens: int, min_tokens: int = 64) -> None:
        """`target_seconds`: what a chunk may add to a decode step (0: no pacing, `max_tokens`
        alone); `max_tokens`: the token cap (0: none, and no pacing); `min_tokens`: the least a
        chunk is given, so that a prompt always moves however slow the machine."""
        self.target_seconds = target_seconds
        self.max_tokens = max_tokens
        self.min_tokens = min(min_tokens, max_tokens)
        self._decode_seconds: float | None = None  # a decode-only step's recent average
        self._prompt_seconds = 0.0  # decayed sums over steps with a prompt: its share of their time
        self._prompt_tokens = 0.0  # ... and its tokens

    @property
    def seconds_per_token(self) -> float | None:
        """A prompt token's recent cost; None before any step with a prompt."""
        return self._prompt_seconds / self._prompt_tokens if self._prompt_tokens else None

    def observe(self, num_decodes: int, num_prompt_tokens: int, seconds: float) -> None:
        """A step ran `num_decodes` decode rows and `num_prompt_tokens` prompt tokens in `seconds`."""
        if not num_prompt_tokens:
            if num_decodes:
                last = self._decode_seconds
                self._decode_seconds = seconds if last is None else DECAY * seconds + (1 - DECAY) * last
            return
        decode_share = (self._decode_seconds or 0.0) if num_decodes else 0.0
        prompt_seconds = max(seconds - decode_share, 0.0)
        self._prompt_seconds = DECAY * prompt_seconds + (1 - DECAY) * self._prompt_seconds
        self._prompt_tokens = DECAY * num_prompt_tokens + (1 - DECAY) * self._prompt_tokens

    def cap(self) -> int:
        """The most prompt tokens one sequence may take in a step that also decodes (0: no cap)."""
        per_token = self.seconds_per_token
        if not self.target_seconds or not self.max_tokens or not per_token:
            return self.max_tokens
        fits = int(self.target_seconds / per_token) // GRAIN * GRAIN
        return min(max(self.min_tokens, fits), self.max_tokens)
