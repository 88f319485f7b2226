"""POST /v1/completions: OpenAI's legacy text completions to and from one generation request."""
