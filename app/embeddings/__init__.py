"""OpenAI's embeddings API (`POST /v1/embeddings`): the request, its checks against the served
encoder, and the response; the vectors come from the encoder's batching loop (models/embedding/)."""
