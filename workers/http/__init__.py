"""The HTTP gateway: REST over memq's operations, one API key per app
(:mod:`.worker` is the worker kind, :mod:`.api` the routes)."""
