"""The load tester: HTTP load on surge or any OpenAI-compatible server (`python -m scripts.loadtest`).

Knows only HTTP (httpx) and the OpenAI wire format: it imports nothing from the server, the engine
or torch, so it starts in a blink and never competes with a server for more than its own requests.
`workload` makes the requests, `client` sends one (with retries), `runner` drives the open or closed
loop with a progress line, `report` and `plot` render the result, `cli` wires the flags.
"""
