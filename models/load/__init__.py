"""How loaded the server is, by tier: sliding-window figures, one sample per request."""
