"""Facts about users extracted from the stream (issue 42): so far the LLM calls, not yet a worker kind."""
