"""The tokenizer as the engine and the API need it: prompts in, token ids out, text back.

Wraps a transformers tokenizer: the model's own chat template, eos ids, and a fast decode
function for the incremental detokenizer (the Rust backend directly when there is one; the
Python wrapper costs several times more per call and decoding runs per token).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from models.loading.control_tokens import ControlTokens

if TYPE_CHECKING:  # the HTTP process imports this module: transformers only where it is used
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


# What the renderer itself gives the template, and apply_chat_template's own arguments: the names
# transformers passes (`messages`, `tools`, `documents`, `add_generation_prompt`), the Jinja
# globals it defines, and, per tokenizer, its special tokens (`Tokenizer.reserved_template_variables`).
# A request's template variables may not set them: `bos_token` set from a request would be
# written by the template as a real control token (transformers lets template variables replace
# the special tokens).
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "raise_exception",
        "strftime_now",
        "dict",
        "namespace",
        "additional_special_tokens",
        "conversation",
        "chat_template",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
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
        self._backend_decode = backend.decode if backend is not None else None
        is_byte_level = backend is not None and type(backend.decoder).__name__ == "ByteLevel"
        self._byte_decoder = _byte_decoder() if is_byte_level else None
        specials = [token.content for token in hf_tokenizer.added_tokens_decoder.values() if token.special]
        self._control = ControlTokens([*specials, *hf_tokenizer.all_special_tokens])
        self.reserved_template_variables = RESERVED_TEMPLATE_VARIABLES | frozenset(
            [*hf_tokenizer.SPECIAL_TOKENS_ATTRIBUTES, *hf_tokenizer.special_tokens_map]
        )
        # Per-token caches for logprobs; bounded by the vocabulary.
        self._text_cache: dict[int, str] = {}
        self._bytes_cache: dict[int, bytes] = {}

    def use_chat_template(self, template: str) -> None:
        """Render chats with `template` (a --chat-template file) instead of the model's own."""
        self.hf.chat_template = template
        self.has_chat_template = True

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        # Completions prompts get the tokenizer's usual special tokens (e.g. Llama's BOS).
        return list(self.hf.encode(text))

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Apply the model's chat template with the generation prompt (unless told not to: vLLM's
        /tokenize may ask for the conversation alone); return token ids.

        `tools` (OpenAI's tool objects) reach the template as `tools`, as transformers passes
        them; `template_kwargs` become template variables (e.g. `enable_thinking`) and may not
        name a reserved one (ValueError; the API checks first, for a 400 naming it). Every
        client string among them is defused first, in one walk (models/loading/control_tokens.py)."""
        variables = dict(template_kwargs or {})
        reserved = sorted(self.reserved_template_variables.intersection(variables))
        if reserved:
            raise ValueError(f"template variables the renderer provides cannot be set: {', '.join(reserved)}")
        messages, tools, variables = self._control.defuse_all((messages, tools or None, variables))
        template = None if self.has_chat_template else DEFAULT_CHAT_TEMPLATE
        text = self.hf.apply_chat_template(
            messages,
            tools=tools,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **variables,
        )
        assert isinstance(text, str)
        # The template already wrote any BOS it wants; don't add special tokens twice.
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        if self._backend_decode is not None:
            return str(self._backend_decode(list(token_ids), skip_special_tokens=True))
        return str(self.hf.decode(list(token_ids), skip_special_tokens=True))

    def decode_keeping(self, token_ids: Sequence[int], keep: Collection[int]) -> str:
        """`decode`, except that the special tokens in `keep` stay in the text: the tags a
        tool-call format writes as special tokens (Mistral's `[TOOL_CALLS]`), which its parser
        must see. Other special tokens are skipped as usual."""
        special = self._special_ids
        ids = [token_id for token_id in token_ids if token_id in keep or token_id not in special]
        if self._backend_decode is not None:
            return str(self._backend_decode(ids, skip_special_tokens=False))
        return str(self.hf.decode(ids, skip_special_tokens=False))

    def special_token_id(self, text: str) -> int | None:
        """The id of `text` when it is one special token of the vocabulary."""
        token_id = self.hf.convert_tokens_to_ids(text)
        return token_id if isinstance(token_id, int) and token_id in self._special_ids else None

    @functools.cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(
            token_id for token_id, token in self.hf.added_tokens_decoder.items() if token.special
        ) | frozenset(self.hf.all_special_ids)

    def token_text(self, token_id: int) -> str:
        """The text of one token on its own, for logprobs (special tokens included).

        A token holding part of a multi-byte character reads as U+FFFD; `token_bytes` has
        its exact bytes, as OpenAI's `bytes` field does.
        """
        text = self._text_cache.get(token_id)
        if text is None:
            text = self._text_cache[token_id] = str(self.hf.decode([token_id], skip_special_tokens=False))
        return text

    def token_bytes(self, token_id: int) -> bytes:
        raw = self._bytes_cache.get(token_id)
        if raw is None:
            raw = self._bytes_cache[token_id] = self._raw_bytes(token_id)
        return raw

    def _raw_bytes(self, token_id: int) -> bytes:
        piece = self.hf.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            if self._byte_decoder is not None and all(c in self._byte_decoder for c in piece):
                return bytes(self._byte_decoder[c] for c in piece)  # GPT-2 style byte-level BPE
            match = _BYTE_FALLBACK.fullmatch(piece)
            if match is not None:  # SentencePiece byte fallback, e.g. <0xE2>
                return bytes([int(match.group(1), 16)])
        return self.token_text(token_id).encode()


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each byte is shown as a printable character; this inverts it."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}
