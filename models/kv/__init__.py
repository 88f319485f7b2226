"""Keys and values: the slot cache, its memory budget, the prefix cache's index and pool."""
