"""One streaming generator for every protocol: an output source to SSE bytes.

Each protocol brings a `StreamRenderer` (what its events look like, and how its stream ends);
this module owns what every stream does alike: keep-alives while the source is silent, usage
counting, the end after an output that carries an error, and the ending: the last tokens and the
protocol's closing events leave in one `LastEvents` write (app/generation/sse.py), so a stream's
end costs one write, not three.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from app.generation.sse import DONE, KEEPALIVE, LastEvents, SSEResponse, error_event, event, sse_response
from app.openai import ChunkEncoder, Usage, cached_tokens
from models import FinishReason, OutputSource, RequestOutput


class StreamRenderer(Protocol):
    def opening(self, num_choices: int) -> bytes:
        """Events that go out with the first tokens (chat's role chunks, as vLLM sends them)."""
        ...

    def render(self, index: int, output: RequestOutput) -> bytes:
        """The events of one output delta of choice `index`: its text, logprobs and finish."""
        ...

    def failure(self, message: str, kind: str) -> bytes:
        """The stream's last events after an output with an error (`kind`: an OpenAI error type)."""
        ...

    def ending(self, usage: Usage) -> bytes:
        """The stream's last events once every choice has finished."""
        ...


class DoneEnding:
    """How OpenAI's chat and legacy completion streams end: the usage chunk when asked for, then
    `[DONE]`; after an error, an error event, then `[DONE]`."""

    encoder: ChunkEncoder

    def failure(self, message: str, kind: str) -> bytes:
        return error_event(message, kind) + DONE

    def ending(self, usage: Usage) -> bytes:
        return (event(self.encoder.usage(usage)) if self.encoder.include_usage else b"") + DONE


def stream_response(
    source: OutputSource,
    renderer: StreamRenderer,
    num_prompt_tokens: int,
    keepalive: float,
    headers: dict[str, str] | None,
    num_prompts: int = 1,
    settle: Callable[[], Awaitable[None]] | None = None,
) -> SSEResponse:
    """A protocol's stream as the HTTP response: its events, and the source released however the
    response ends (app/generation/sse.py says why that is the response's job). `settle` is awaited
    before the last events go out: what the client may act on once it reads them (a stored
    response it continues from) is in place by then."""
    events = stream_events(source, renderer, num_prompt_tokens, keepalive, num_prompts, settle)
    return sse_response(events, headers, on_close=lambda: source.__aexit__(None, None, None))


async def stream_events(
    source: OutputSource,
    renderer: StreamRenderer,
    num_prompt_tokens: int,
    keepalive: float,
    num_prompts: int = 1,
    settle: Callable[[], Awaitable[None]] | None = None,
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
                    failure = renderer.failure(out.error, kind)
                    if settle is not None:
                        await settle()
                    yield LastEvents(b"".join(parts) + failure)
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
    ending = renderer.ending(usage)
    if settle is not None:
        await settle()
    yield LastEvents(opening + last + ending)
