"""OpenAI's wire format, shared by its protocols: the only place OpenAI's field names are spelled out.

- `requests`: the sampling fields every generation request shares, their checks, and the
  mapping to `SamplingParams` (each protocol's own body is in its room);
- `usage`: completion ids and the usage block;
- `chunks`: what every streamed chunk's JSON shares, built as strings for the per-token path;
- `render`: engine outputs (finish reasons, logprobs) in OpenAI's words;
- `tools`, `limits`, `base`: tool fields, caps on every list, the base of every body.
"""

from app.openai.chunks import MIN_LOGPROB, ChunkEncoder, chat_logprob_entry, completion_logprobs
from app.openai.requests import MAX_CHOICES, JsonSchemaFormat, ResponseFormat, SamplingRequest, StreamOptions
from app.openai.usage import Usage, cached_tokens, new_chat_completion_id, new_completion_id

__all__ = [
    "MAX_CHOICES",
    "MIN_LOGPROB",
    "ChunkEncoder",
    "JsonSchemaFormat",
    "ResponseFormat",
    "SamplingRequest",
    "StreamOptions",
    "Usage",
    "cached_tokens",
    "chat_logprob_entry",
    "completion_logprobs",
    "new_chat_completion_id",
    "new_completion_id",
]
