"""Embeddings: a sentence encoder (`encoder.py`) and its own batching loop on one thread
(`batcher.py`), beside the chat engine rather than inside its step loop: an embedding is one
forward pass with nothing to keep between steps."""
