"""The tokenizer as the engine and the API need it: prompts in, token ids out, text back.

Wraps a transformers tokenizer: the model's own chat template, eos ids, and a fast decode
function for the incremental detokenizer (the Rust backend directly when there is one; the
Python wrapper costs several times more per call and decoding runs per token).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

# Used only when a model ships no chat template (base models such as GPT-2): plain ChatML.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class Tokenizer:
    def __init__(self, hf_tokenizer: PreTrainedTokenizerBase, eos_token_ids: Sequence[int] = ()) -> None:
        self.hf = hf_tokenizer
        ids = set(eos_token_ids)
        if hf_tokenizer.eos_token_id is not None:
            ids.add(int(hf_tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(ids)
        self.has_chat_template = bool(getattr(hf_tokenizer, "chat_template", None))
        backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        if backend is not None:
            self._backend_decode = backend.decode
        else:
            self._backend_decode = None

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        # Completions prompts get the tokenizer's usual special tokens (e.g. Llama's BOS).
        return list(self.hf.encode(text))

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Apply the model's chat template with the generation prompt; return token ids."""
        template = None if self.has_chat_template else DEFAULT_CHAT_TEMPLATE
        text = self.hf.apply_chat_template(
            [dict(m) for m in messages], chat_template=template, add_generation_prompt=True, tokenize=False
        )
        assert isinstance(text, str)
        # The template already wrote any BOS it wants; don't add special tokens twice.
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        if self._backend_decode is not None:
            return str(self._backend_decode(list(token_ids), skip_special_tokens=True))
        return str(self.hf.decode(list(token_ids), skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        """The text of one token on its own, for logprobs (special tokens included)."""
        return str(self.hf.decode([token_id], skip_special_tokens=False))
