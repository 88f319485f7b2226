"""What the running server holds and every route reaches: its state, open connections, request
bodies, each request's budget."""
