"""A streamed legacy completion's chunks: OpenAI's `text_completion` objects as JSON text, and the
renderer the shared streaming generator calls (app/generation/streaming.py)."""

from __future__ import annotations

from typing import Any

from app.generation.sse import event
from app.generation.streaming import DoneEnding
from app.openai.chunks import ChunkEncoder, encode
from app.openai.render import completion_logprobs_json, finish_reason_text
from models import RequestOutput, Tokenizer


class CompletionChunkEncoder(ChunkEncoder):
    """Builds every chunk of one streamed legacy completion."""

    def __init__(self, *, completion_id: str, model: str, created: int, include_usage: bool = False) -> None:
        super().__init__(
            object_name="text_completion",
            completion_id=completion_id,
            model=model,
            created=created,
            include_usage=include_usage,
        )

    def text(
        self,
        index: int,
        text: str,
        *,
        logprobs: dict[str, Any] | None = None,
        finish_reason: str | None = None,
    ) -> str:
        """A chunk of text, with logprobs as built by `completion_logprobs`."""
        logprobs_json = "null" if logprobs is None else encode(logprobs)
        finish_json = "null" if finish_reason is None else encode(finish_reason)
        return self._chunk(
            f'{{"index":{index},"text":{encode(text)},"logprobs":{logprobs_json},"finish_reason":{finish_json}}}'
        )


class CompletionChunks(DoneEnding):
    encoder: CompletionChunkEncoder

    """A legacy completion stream's chunks: text with its logprobs (offsets run on per choice) and
    the finish in one chunk."""

    def __init__(self, encoder: CompletionChunkEncoder, tokenizer: Tokenizer, num_choices: int) -> None:
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.offsets = [0] * num_choices  # characters of each choice's text so far

    def opening(self, num_choices: int) -> bytes:
        return b""

    def render(self, index: int, output: RequestOutput) -> bytes:
        logprobs = (
            completion_logprobs_json(self.tokenizer, output.logprobs, self.offsets[index]) if output.logprobs else None
        )
        self.offsets[index] += len(output.text)
        if not (output.text or logprobs or output.finished):
            return b""
        reason = finish_reason_text(output.finish_reason)
        return event(self.encoder.text(index, output.text, logprobs=logprobs, finish_reason=reason))
