"""Long-term memory's index: the backends that store and search it and the
embedders that turn text into vectors.

Shared by the indexing worker (which writes) and the query worker (which
searches); it lives beside them, not inside either, so that no worker kind
imports another.
"""
