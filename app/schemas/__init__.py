"""The OpenAI wire format: the only place OpenAI's field names are spelled out.

- `requests`: request bodies, their validation, and the mapping to `SamplingParams`;
- `responses`: response bodies, models list, usage, logprobs, errors (pydantic);
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
    StreamOptions,
    TextContentPart,
)
from app.schemas.responses import (
    ChatChunkChoice,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatResponseMessage,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionResponse,
    ErrorDetail,
    ErrorResponse,
    FinishReason,
    ModelCard,
    ModelList,
    TopLogprob,
    Usage,
    new_chat_completion_id,
    new_completion_id,
)

__all__ = [
    "DEFAULT_COMPLETION_MAX_TOKENS",
    "MAX_CHOICES",
    "MIN_LOGPROB",
    "ChatChunkChoice",
    "ChatChunkEncoder",
    "ChatCompletionChoice",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatDelta",
    "ChatLogprobs",
    "ChatMessage",
    "ChatResponseMessage",
    "ChatTokenLogprob",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionChunkEncoder",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionResponse",
    "ErrorDetail",
    "ErrorResponse",
    "FinishReason",
    "ModelCard",
    "ModelList",
    "StreamOptions",
    "TextContentPart",
    "TopLogprob",
    "Usage",
    "chat_logprob_entry",
    "completion_logprobs",
    "new_chat_completion_id",
    "new_completion_id",
]
