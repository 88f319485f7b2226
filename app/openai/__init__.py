"""OpenAI's wire format, shared by its protocols: the only place OpenAI's field names are spelled out.

- `requests`: request bodies, their validation, and the mapping to `SamplingParams`;
- `usage`: completion ids and the usage block;
- `chunks`: streaming chunk JSON built as strings, for the per-token path;
- `render`: engine outputs (finish reasons, logprobs) in OpenAI's words;
- `tools`, `limits`, `base`: tool fields, caps on every list, the base of every body.
"""

from app.openai.chunks import (
    MIN_LOGPROB,
    ChatChunkEncoder,
    CompletionChunkEncoder,
    chat_logprob_entry,
    completion_logprobs,
)
from app.openai.requests import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    MAX_CHOICES,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    JsonSchemaFormat,
    ResponseFormat,
    StreamOptions,
    TextContentPart,
)
from app.openai.usage import Usage, cached_tokens, new_chat_completion_id, new_completion_id

__all__ = [
    "DEFAULT_COMPLETION_MAX_TOKENS",
    "MAX_CHOICES",
    "MIN_LOGPROB",
    "ChatChunkEncoder",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionChunkEncoder",
    "CompletionRequest",
    "JsonSchemaFormat",
    "ResponseFormat",
    "StreamOptions",
    "TextContentPart",
    "Usage",
    "cached_tokens",
    "chat_logprob_entry",
    "completion_logprobs",
    "new_chat_completion_id",
    "new_completion_id",
]
