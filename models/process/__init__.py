"""The engine in a process of its own: the spawn, the messages on its pipes, the server's async client."""
