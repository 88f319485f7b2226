"""The OpenAI wire format: the only place OpenAI's field names are spelled out.

- `requests`: request bodies, their validation, and the mapping to `SamplingParams`;
- `responses`: completion ids and the usage block;
- `chunks`: streaming chunk JSON built as strings, for the per-token path.
"""

from app.schemas.chunks import (
    MIN_LOGPROB,
    ChatChunkEncoder,
    CompletionChunkEncoder,
    chat_logprob_entry,
    completion_logprobs,
)
from app.schemas.requests import (
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
from app.schemas.responses import Usage, cached_tokens, new_chat_completion_id, new_completion_id

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
