"""One request's measurements in the prefix workloads (scripts/benchkit/prefix.py and
prefix_responses.py): a chat turn or a Responses turn alike."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class TurnResult:
    turn: int = 1  # 1-based; single-turn workloads: 1
    error: str | None = None
    ttft_s: float | None = None  # until the first chunk with non-empty content
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # None: the server did not report prompt_tokens_details
    completion_tokens: int = 0
    text: str = ""  # the reply: multi-turn's next assistant message (left out of the JSON)
    response_id: str | None = None  # responses-chain: what the next turn continues from

    def as_json(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if key not in ("text", "response_id")}
