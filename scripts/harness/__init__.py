"""What the scripts and the tests share to drive surge from outside: a server process on a free
port (started, made ready, stopped by its process group), a throwaway `redis-server`, /proc readers,
one percentile, and one httpx chat client.

Only HTTP, subprocesses and /proc: nothing here imports the server, the engine or torch.
"""
