"""POST /v1/messages: Anthropic's Messages API to and from one generation request."""
