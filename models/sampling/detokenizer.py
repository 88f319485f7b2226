"""Incremental detokenisation with stop strings, one instance per sequence.

Decoding one token at a time breaks multi-byte characters and drops the leading space of
SentencePiece-style tokens, so each step decodes a short window (a few tokens of context plus
the new ones) and emits only the text that the window adds, once it no longer ends in an
incomplete character (U+FFFD). This works for every tokenizer transformers loads.

Stop strings are matched on the text, so they match across token boundaries. Text that could
still turn out to be the start of a stop string is held back until it can't; matched stop
strings are never emitted. At the end the held-back text is released.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from models.sampling.stop_strings import StopStrings

# Prompt tokens kept as left context: enough for any tokenizer's merges to settle.
_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"

DecodeFn = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    def __init__(self, decode: DecodeFn, prompt_token_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        stops = [s for s in stop if s]
        self._stops = StopStrings(stops) if stops else None
        self.text = ""  # all decoded output text, stop string excluded once matched
        self._num_emitted = 0  # characters of self.text already returned

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add one token; return (text safe to emit now, whether a stop string matched)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return "", False  # an incomplete character, or a token with no text of its own
        added = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        # Drop ids before the window: the decode window is already bounded, this bounds memory.
        if self._prefix_offset > 64:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return self._append(added)

    @property
    def matched_stop(self) -> str | None:
        """The stop string that ended the text (None until one has)."""
        return self._stops.matched if self._stops is not None else None

    def flush(self) -> str:
        """Release the text held back for a possible stop string (the sequence has ended)."""
        rest = self.text[self._num_emitted :]
        self._num_emitted = len(self.text)
        return rest

    def _append(self, added: str) -> tuple[str, bool]:
        if self._stops is None:
            self.text += added
            self._num_emitted = len(self.text)
            return added, False
        hit = self._stops.feed(added, len(self.text))
        self.text += added
        if hit is not None:
            self.text = self.text[:hit]
            return self.flush(), True
        safe_end = len(self.text) - self._stops.held
        out = self.text[self._num_emitted : safe_end]
        self._num_emitted = max(self._num_emitted, safe_end)
        return out, False
