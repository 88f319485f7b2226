"""The HTTP server: app factory and lifespan, uvicorn's protocol, connections, the door, errors, shutdown."""
