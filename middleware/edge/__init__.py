"""The door's cheap layers, each a pure ASGI middleware that answers from the request line and headers:
request ids, the Host check while auth is off, API keys, the body size limit, and refusals while
draining for shutdown."""
