"""Embedders: texts → unit vectors, behind the Protocol in ``base.py``.

``local`` (default): int8 all-MiniLM-L6-v2 on ONNX Runtime, offline.
``openai``: any OpenAI-compatible ``/v1/embeddings`` endpoint.
``none``: no embedder at all; a keyword-only (BM25) index (``none.py``).
"""

from __future__ import annotations

import asyncio

from memq.workers.index.embedders.base import Embedder, EmbedderError
from memq.workers.settings import IndexingSettings

__all__ = ["Embedder", "EmbedderError", "open_embedder"]


async def open_embedder(settings: IndexingSettings) -> Embedder:
    """The embedder ``settings.embedder`` names, ready to use (``dim`` known).

    Imports lazily: the OpenAI one needs no ONNX Runtime, the local one no
    httpx, and ``none`` neither (nor a model file).
    """
    if settings.embedder == "none":
        from memq.workers.index.embedders.none import KeywordOnly

        return KeywordOnly()
    if settings.embedder == "openai":
        from memq.workers.index.embedders.openai import OpenAIEmbedder

        embedder = OpenAIEmbedder(settings.openai)
        try:
            return await embedder.open()
        except BaseException:
            await embedder.close()
            raise
    from memq.workers.index.embedders.local import LocalEmbedder

    # Hashing and loading the model takes a moment: keep the event loop free.
    return await asyncio.to_thread(LocalEmbedder, settings.local)
