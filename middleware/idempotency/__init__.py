"""`Idempotency-Key`: the ASGI layer that claims, records and replays (`asgi.py`), and where keys live:
the store interface and the in-process store (`store.py`), the Redis store (`redis_store.py`)."""
