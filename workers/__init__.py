"""memq's workers: the services behind the contracts, and the ``memq`` command.

Token counting (:mod:`memq.workers.memory.tokens`) is pure; which tiktoken
encodings load offline is I/O (:mod:`memq.workers.encodings`). They are wired
together here, once, for every process that imports any worker module. The
installer runs on the first count, not at import.
"""

from importlib.metadata import version as _version

from memq.workers import encodings as _encodings
from memq.workers.memory import tokens as _tokens

_tokens.use_offline_encodings(_encodings.available_encodings)

# What each worker's NATS micro service reports as its version (`nats micro info`).
VERSION = _version("memq")
