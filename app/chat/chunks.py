"""A streamed chat completion's chunks: the role first, then reasoning and content deltas with
their logprobs, tool-call fragments in OpenAI's delta format, then each choice's finish.

Each choice's text goes through its own reasoning stream (for a reasoning model: text inside
`<think>` becomes `delta.reasoning_content`) and then, with tools, its own tool-call stream
(app/tools/): content deltas come out as content, a call's first fragment carries its index, id,
type, name and `arguments: ""`, later fragments only argument text. A choice's logprobs ride on
the first chunk its output produced (an empty delta if it produced none).
"""

from __future__ import annotations

from app.chat.encoder import ChatChunkEncoder
from app.chat.render import chat_finish_reason
from app.generation.sse import event
from app.generation.streaming import DoneEnding
from app.openai.render import chat_logprobs_json
from app.reasoning import ReasoningDelta
from app.reply_stream import Piece, ReplyStream
from app.tools.calls import ArgumentsDelta, CallStart, ContentDelta
from app.tools.choice import ToolPlan
from models import RequestOutput, Tokenizer


class ChatChunks(DoneEnding):
    encoder: ChatChunkEncoder

    def __init__(
        self, encoder: ChatChunkEncoder, tokenizer: Tokenizer, plan: ToolPlan | None, reasoning: bool | None
    ) -> None:
        """reasoning: None for a model that does not reason, else whether the reply starts inside
        a reasoning block (the prompt opened it)."""
        self.encoder = encoder
        self.tokenizer = tokenizer
        self._plan = plan
        self._reasoning = reasoning
        self._replies: dict[int, ReplyStream] = {}  # one per choice
        self._num_calls: dict[int, int] = {}

    def opening(self, num_choices: int) -> bytes:
        return b"".join(event(self.encoder.role(i)) for i in range(num_choices))

    def render(self, index: int, output: RequestOutput) -> bytes:
        logprobs = chat_logprobs_json(self.tokenizer, output.logprobs) if output.logprobs else None
        chunks = []
        for chunk_event in self._events(index, output):
            chunks.append(event(self._chunk(index, chunk_event, logprobs)))
            logprobs = None  # on the first chunk only
        if logprobs:
            chunks.append(event(self.encoder.delta(index, None, logprobs=logprobs)))
        if output.finished:
            reason = chat_finish_reason(output.finish_reason, self._num_calls.get(index, 0), self._plan)
            chunks.append(event(self.encoder.delta(index, None, finish_reason=reason)))
        return b"".join(chunks)

    def _events(self, index: int, output: RequestOutput) -> list[Piece]:
        """The output's text as events: reasoning first split off, then calls."""
        stream = self._replies.get(index)
        if stream is None:
            stream = self._replies[index] = ReplyStream(self._reasoning, self._plan)
        return stream.push(output.text, output.finished)

    def _chunk(self, index: int, chunk_event: Piece, logprobs: list[dict[str, object]] | None) -> str:
        if isinstance(chunk_event, ContentDelta):
            return self.encoder.delta(index, chunk_event.text, logprobs=logprobs)
        if isinstance(chunk_event, ReasoningDelta):
            return self.encoder.reasoning(index, chunk_event.text, logprobs=logprobs)
        if isinstance(chunk_event, CallStart):
            self._num_calls[index] = self._num_calls.get(index, 0) + 1
            call: dict[str, object] = {
                "index": chunk_event.index,
                "id": chunk_event.id,
                "type": "function",
                "function": {"name": chunk_event.name, "arguments": ""},
            }
        else:
            assert isinstance(chunk_event, ArgumentsDelta)
            call = {"index": chunk_event.index, "function": {"arguments": chunk_event.text}}
        return self.encoder.tool_calls(index, [call], logprobs=logprobs)
