"""POST /v1/chat/completions: OpenAI's Chat Completions to and from one generation request."""
