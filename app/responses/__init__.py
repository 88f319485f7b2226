"""POST /v1/responses: OpenAI's Responses API to and from one generation request."""
