"""The tool-call formats surge reads, by name, and the one a model's chat template writes.

`--tool-call-parser NAME` picks one; otherwise the chat template decides: a template that
writes `[TOOL_CALLS]` is Mistral's, one that writes `<|python_tag|>` (or Llama's `ipython`
role) is Llama 3's, and everything else, `<tool_call>` templates first among them, is Hermes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.tools.call_stream import ToolCallStream, fold
from app.tools.calls import ParsedReply
from app.tools.hermes import HermesStream
from app.tools.llama3 import Llama3Stream
from app.tools.mistral import MistralStream


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    stream: Callable[[], ToolCallStream]
    # The tags its replies are read by: where the tokenizer has them as special tokens, the
    # detokenizer must keep them in the text (it skips special tokens otherwise).
    tags: tuple[str, ...]

    def parse(self, text: str) -> ParsedReply:
        """A whole reply: its content and calls (the same code as the stream, so they agree)."""
        return fold(self.stream(), text)


FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", HermesStream, ("<tool_call>", "</tool_call>")),
    "llama3_json": ToolFormat("llama3_json", Llama3Stream, ("<|python_tag|>",)),
    "mistral": ToolFormat("mistral", MistralStream, ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")),
}


def format_for(chat_template: str | None, name: str | None = None) -> ToolFormat:
    """The format `name` names, or the one `chat_template` writes. Raises KeyError for an unknown name."""
    if name is not None:
        return FORMATS[name]
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return FORMATS["mistral"]
    if "<|python_tag|>" in template or "ipython" in template:
        return FORMATS["llama3_json"]
    return FORMATS["hermes"]
