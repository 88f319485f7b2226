"""Per-request sampling parameters: what the API layer hands the engine.

Owns the validated, engine-side view of OpenAI's sampling fields. It knows nothing of HTTP
or of OpenAI's field names; `app/` translates requests into this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4
# Temperatures below this sample greedily, as in vLLM (its _SAMPLING_EPS). Dividing float32 logits
# by a smaller one overflows, and one below float32's range divides by zero: a fuzzed 7.7e-134 gave
# NaN weights, an out-of-vocabulary token and a 500.
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0 (or below GREEDY_TEMPERATURE) means greedy
    top_p: float = 1.0  # 1.0 means off
    top_k: int = 0  # 0 means off
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    # None: no logprobs. 0..MAX_TOP_LOGPROBS: the chosen token's logprob plus this many alternatives.
    logprobs: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # llguidance grammar text (models/grammar/compiler.py) every output must match, or None. A string, so
    # it pickles to the engine process and is part of the dedup fingerprint as it is.
    grammar: str | None = None
    # Special tokens kept in the text instead of skipped: a tool-call format's tags (e.g.
    # Mistral's [TOOL_CALLS]), which the reply's parser reads.
    keep_special_ids: tuple[int, ...] = ()
    # vLLM's `cache_salt`: the prefix cache serves this sequence only blocks cached under the same
    # salt (and the same API key: models/scheduler/sequence.py). "" is no salt.
    cache_salt: str = ""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError("temperature must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be greater than 0 and at most 1")
        if self.top_k < 0:
            raise ValueError("top_k must be 0 (off) or positive")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError("presence_penalty must be between -2 and 2")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError("frequency_penalty must be between -2 and 2")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed")
        for token_id, bias in self.logit_bias.items():
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias for token {token_id} must be between -100 and 100")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
