"""A streamed Response: OpenAI's semantic events, each with its `sequence_number`.

`response.created` and `response.in_progress` open the stream (with the first tokens, as chat's
role chunks go); then each output item in turn: `response.output_item.added`, its content
(`response.content_part.added`, `response.output_text.delta`... for a message;
`response.reasoning_text.delta` for reasoning; `response.function_call_arguments.delta` for a
call), its `.done` events and `response.output_item.done`. The stream ends with
`response.completed`, or `response.incomplete` when the reply was cut at `max_output_tokens`, or
`response.failed` after an engine error: each carries the whole Response. There is no `[DONE]`.

Text outside calls that is only whitespace (between a model's calls) opens no message item.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.generation.sse import event
from app.openai import Usage as ChatUsage
from app.openai.render import chat_logprobs_json
from app.reasoning import ReasoningDelta
from app.reply_stream import Piece, ReplyStream
from app.responses.output import (
    ERROR_CODES,
    ResponseShell,
    Usage,
    call_item,
    message_item,
    new_id,
    reasoning_item,
    status_of,
    text_part,
)
from app.tools.calls import CallStart, ContentDelta
from app.tools.choice import ToolPlan
from models import FinishReason, RequestOutput, Tokenizer

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class _Item:
    """The output item being streamed."""

    def __init__(self, kind: str, index: int, item_id: str, call_id: str = "", name: str = "") -> None:
        self.kind = kind  # "message", "reasoning" or "function_call"
        self.index = index
        self.id = item_id
        self.call_id = call_id
        self.name = name
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []


class ResponseEvents:
    def __init__(
        self,
        shell: ResponseShell,
        tokenizer: Tokenizer,
        plan: ToolPlan | None,
        reasoning: bool | None,
        want_logprobs: bool,
        count_tokens: Callable[[str], int],
    ) -> None:
        self.shell = shell
        self.tokenizer = tokenizer
        self._plan = plan
        self._want_logprobs = want_logprobs
        self._count_tokens = count_tokens
        # The final Response once the stream ends: stored (when the request asks) before the
        # last event goes out (app/responses/route.py).
        self.final: dict[str, Any] | None = None
        self._sequence = 0
        self._output: list[dict[str, Any]] = []
        self._item: _Item | None = None
        self._whitespace = ""  # held until a message item opens: none opens for whitespace alone
        self._reply = ReplyStream(reasoning, plan)
        self._reasoning_text: list[str] = []
        self._finish: FinishReason | None = None

    # --- StreamRenderer ---------------------------------------------------------------------

    def opening(self, num_choices: int) -> bytes:
        response = self.shell.json("in_progress", [], None)
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def render(self, index: int, output: RequestOutput) -> bytes:
        logprobs = (
            chat_logprobs_json(self.tokenizer, output.logprobs) if self._want_logprobs and output.logprobs else []
        )
        parts = [self._piece(piece, logprobs) for piece in self._reply.push(output.text, output.finished)]
        if output.finished:
            self._finish = output.finish_reason
            if self._item is None and not self._output:  # an empty reply is still one message
                parts.append(self._open("message"))
            parts.append(self._close())
        return b"".join(parts)

    def failure(self, message: str, kind: str) -> bytes:
        error = {"code": ERROR_CODES.get(kind, "server_error"), "message": message}
        response = self.shell.json("failed", self._output, None, error=error)
        self.final = response
        return self._event("response.failed", response=response)

    def ending(self, usage: ChatUsage) -> bytes:
        status, incomplete = status_of(self._finish)
        reasoning_tokens = self._count_tokens("".join(self._reasoning_text)) if self._reasoning_text else 0
        totals = Usage(
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.prompt_tokens_details.cached_tokens,
            min(reasoning_tokens, usage.completion_tokens),
        )
        response = self.shell.json(status, self._output, totals, incomplete=incomplete)
        self.final = response
        return self._event(f"response.{status}", response=response)

    # --- pieces -----------------------------------------------------------------------------

    def _piece(self, piece: Piece, logprobs: list[dict[str, Any]]) -> bytes:
        if isinstance(piece, ReasoningDelta):
            self._reasoning_text.append(piece.text)
            opened = self._open("reasoning") if self._kind != "reasoning" else b""
            assert self._item is not None
            self._item.text.append(piece.text)
            return opened + self._delta("response.reasoning_text.delta", piece.text)
        if isinstance(piece, ContentDelta):
            if self._kind != "message":
                if not (self._whitespace + piece.text).strip():
                    self._whitespace += piece.text
                    return b""
                text, self._whitespace = self._whitespace + piece.text, ""
                return self._open("message") + self._text(text, logprobs)
            return self._text(piece.text, logprobs)
        if isinstance(piece, CallStart):
            return self._open("function_call", call_id=piece.id, name=piece.name)
        item = self._item
        assert item is not None and item.kind == "function_call"
        item.text.append(piece.text)
        return self._event(
            "response.function_call_arguments.delta", item_id=item.id, output_index=item.index, delta=piece.text
        )

    @property
    def _kind(self) -> str | None:
        return self._item.kind if self._item is not None else None

    def _text(self, text: str, logprobs: list[dict[str, Any]]) -> bytes:
        item = self._item
        assert item is not None
        item.text.append(text)
        item.logprobs += logprobs
        return self._event(
            "response.output_text.delta",
            item_id=item.id,
            output_index=item.index,
            content_index=0,
            delta=text,
            logprobs=logprobs,
        )

    def _delta(self, kind: str, text: str) -> bytes:
        item = self._item
        assert item is not None
        return self._event(kind, item_id=item.id, output_index=item.index, content_index=0, delta=text)

    # --- items ------------------------------------------------------------------------------

    def _open(self, kind: str, *, call_id: str = "", name: str = "") -> bytes:
        closed = self._close()
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        item = self._item = _Item(kind, len(self._output), new_id(prefix), call_id, name)
        if kind == "function_call":
            added = call_item(item.id, call_id, self.shell.turn, name, "", "in_progress")
            return closed + self._event("response.output_item.added", output_index=item.index, item=added)
        if kind == "reasoning":
            added, part = reasoning_item(item.id, None), {"type": "reasoning_text", "text": ""}
        else:
            added, part = message_item(item.id, "", None, "in_progress"), text_part("")
        return (
            closed
            + self._event("response.output_item.added", output_index=item.index, item=added)
            + self._event(
                "response.content_part.added", item_id=item.id, output_index=item.index, content_index=0, part=part
            )
        )

    def _close(self) -> bytes:
        """The open item's `.done` events; it joins the output."""
        item, self._item = self._item, None
        if item is None:
            return b""
        text = "".join(item.text)
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "function_call":
            done = call_item(item.id, item.call_id, self.shell.turn, item.name, text, "completed")
            events = self._event("response.function_call_arguments.done", **where, name=done["name"], arguments=text)
        elif item.kind == "reasoning":
            done = reasoning_item(item.id, text)
            part = {"type": "reasoning_text", "text": text}
            events = self._event("response.reasoning_text.done", **where, content_index=0, text=text) + self._event(
                "response.content_part.done", **where, content_index=0, part=part
            )
        else:
            status = "incomplete" if self._finish is FinishReason.LENGTH else "completed"
            done = message_item(item.id, text, item.logprobs, status)
            events = self._event(
                "response.output_text.done", **where, content_index=0, text=text, logprobs=item.logprobs
            ) + self._event("response.content_part.done", **where, content_index=0, part=text_part(text, item.logprobs))
        self._output.append(done)
        return events + self._event("response.output_item.done", output_index=item.index, item=done)

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\n" + event(_encode(payload))
