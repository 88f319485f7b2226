"""Rate limits per API key: the requests bucket at the door (`asgi.py`), the tokens bucket after parse
(`tokens.py`), the limits and a request's view of its buckets (`limits.py`), and the buckets
themselves, in process or in Redis (`buckets.py`)."""
