"""Index backends behind one Protocol (:mod:`.base`): Weaviate and embedded."""

from __future__ import annotations

from memq.workers.index.backends.base import IndexBackend
from memq.workers.settings import Settings


def open_backend(settings: Settings) -> IndexBackend:
    """The configured backend, not yet opened (call ``await backend.open()``)."""
    if settings.index_backend() == "weaviate":
        from memq.workers.index.backends.weaviate import WeaviateIndex

        return WeaviateIndex(settings.indexing.weaviate)
    from memq.workers.index.backends.embedded import EmbeddedIndex

    settings.index_path().parent.mkdir(parents=True, exist_ok=True)
    return EmbeddedIndex(settings.index_path())
