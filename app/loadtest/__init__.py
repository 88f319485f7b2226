"""The load tester behind `surge loadtest` and `scripts/loadtest.py`: HTTP load on any OpenAI-compatible server.

Knows only HTTP (httpx) and the OpenAI wire format: it imports nothing from the engine, FastAPI or
torch, so it starts in a blink and never competes with a server for more than its own requests.
`workload` makes the requests, `client` sends one (with retries), `runner` drives the open or closed
loop with a progress line, `report` and `plot` render the result, `cli` wires the flags.
"""

from app.loadtest.cli import main

__all__ = ["main"]
