"""Facts about users extracted from the stream: so far the LLM calls, not yet a worker kind."""
