"""One streaming generator for both generation routes: an output source to SSE bytes.

Each route brings a `ChunkRenderer` (what its chunks look like); this module owns what every
stream does alike: keep-alives while the source is silent, an error event (then `[DONE]`) when an
output carries an error, usage counting, and the ending: the last tokens, the usage chunk and
`[DONE]` leave in one `LastEvents` write (app/generation/sse.py), so a stream's end costs one write, not three.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from app.generation.sse import DONE, KEEPALIVE, LastEvents, error_event, event
from app.openai import Usage, cached_tokens
from models import FinishReason, OutputSource, RequestOutput


class ChunkRenderer(Protocol):
    def opening(self, num_choices: int) -> bytes:
        """Events that go out with the first tokens (chat's role chunks, as vLLM sends them)."""
        ...

    def render(self, index: int, output: RequestOutput) -> bytes:
        """The events of one output delta of choice `index`: its text, logprobs and finish."""
        ...

    def usage(self, usage: Usage) -> str:
        """The final usage chunk's JSON."""
        ...


async def stream_events(
    source: OutputSource,
    renderer: ChunkRenderer,
    num_prompt_tokens: int,
    keepalive: float,
    include_usage: bool,
    num_prompts: int = 1,
) -> AsyncIterator[bytes]:
    num_completion_tokens = 0
    cached = [0] * len(source.request_ids)  # prompt tokens each choice reused from the prefix cache
    opening = renderer.opening(len(source.request_ids))
    last = b""
    async with source:
        while not source.finished:
            outputs = await source.next_outputs(keepalive)
            if not outputs:
                yield KEEPALIVE
                continue
            parts: list[bytes] = [opening]
            opening = b""
            for out in outputs:
                if out.error is not None:
                    kind = "invalid_request_error" if out.finish_reason is FinishReason.INVALID else "server_error"
                    yield LastEvents(b"".join(parts) + error_event(out.error, kind) + DONE)
                    return
                num_completion_tokens += len(out.token_ids)
                index = source.index[out.request_id]
                cached[index] = out.num_cached_tokens
                parts.append(renderer.render(index, out))
            if source.finished:
                last = b"".join(parts)
            else:
                yield b"".join(parts)
    usage = Usage.of(num_prompt_tokens, num_completion_tokens, cached_tokens(cached, num_prompts))
    tail = event(renderer.usage(usage)) if include_usage else b""
    yield LastEvents(opening + last + tail + DONE)
