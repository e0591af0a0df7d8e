"""The embedder of a keyword-only index (``indexing.embedder = "none"``).

No model, no vectors: docs are stored with their text alone and searched by
BM25. Nothing heavy is imported, so a worker in this mode starts without
ONNX Runtime or a model file. Its ``dim`` is 0, which every part of memq
reads as "keyword-only": the indexer stores docs without vectors, the index
generation records dimension 0, and searches asking for ``vector`` or
``hybrid`` are answered by keyword, with a note saying so.
"""

from __future__ import annotations

from collections.abc import Sequence

MODEL = "none"


class KeywordOnly:
    """:class:`~memq.workers.index.embedders.base.Embedder` with no vectors
    (``model`` ``"none"``, ``dim`` 0)."""

    model = MODEL
    dim = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """An empty vector per text (the indexer does not even call this)."""
        return [[] for _ in texts]

    async def close(self) -> None:
        pass
