"""Identical deterministic requests share one generation: the cache and its after-parse layer
(`cache.py`), one shared generation and its listeners (`flight.py`), finished results in process and
in Redis (`store.py`)."""
