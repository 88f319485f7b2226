"""Caps on every list and map a request may carry, and on the strings the engine scans per token.

Without them one body within the size limit could hold millions of items: pydantic validates
(and reports an error for) every one, on the event loop, and some reach the engine's every step.
With a cap, pydantic stops at the first item past it, so a request has a few errors at most.
Where OpenAI documents a limit, it is OpenAI's; the others are far above what clients send.
"""

from __future__ import annotations

# Token ids, max_tokens and top_k: no model needs more, and a bigger number (thousands of digits
# parse as JSON) could not even be printed in the 400 that names it.
MAX_INT = 2**31 - 1
# Each choice is a full sequence in the batch; a cap keeps one request from filling it.
MAX_CHOICES = 16
# Chat turns in one request, and text parts in one message.
MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 256
# Tool calls in one assistant turn of the history.
MAX_MESSAGE_TOOL_CALLS = 128
# OpenAI's limit on tools per request.
MAX_TOOLS = 128
# OpenAI's limit on logit_bias entries; each is applied to its row's logits every step.
MAX_LOGIT_BIAS_ENTRIES = 300
# Token ids that end a sequence (vLLM's stop_token_ids), checked per token.
MAX_STOP_TOKEN_IDS = 128
# Characters in one stop string: the text held back while a stop may be starting grows with it.
MAX_STOP_LENGTH = 512
# Legacy completions: prompts in one request, and sequences (prompts x n) in one request.
MAX_PROMPTS = 128
MAX_SEQUENCES = 256
# Extra chat-template variables (chat_template_kwargs).
MAX_TEMPLATE_KWARGS = 64
