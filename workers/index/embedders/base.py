"""The Protocol of an embedder: texts in, unit-length vectors out.

``model`` names the model *and* its variant (``local:all-MiniLM-L6-v2-int8``,
``openai:text-embedding-3-small@512``); it is recorded with every index
generation, and a different ``model`` or ``dim`` means a rebuild.

An embedder whose model embeds search texts apart from memories (e5's
``query: `` and ``passage: `` prefixes) also has ``embed_queries``;
:func:`embed_queries` uses it when it is there, ``embed`` otherwise.

``dim`` 0 means no vectors at all (:class:`~memq.workers.index.embedders.none.KeywordOnly`):
the index is keyword-only and is searched by BM25 alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


class EmbedderError(Exception):
    """The embedder failed (endpoint down, bad reply); retry later."""


@runtime_checkable
class Embedder(Protocol):
    model: str
    dim: int

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised vector per text, in order. Raises :class:`EmbedderError`."""

    async def close(self) -> None: ...


async def embed_queries(embedder: Embedder, texts: Sequence[str]) -> list[list[float]]:
    """Vectors of search texts: the embedder's ``embed_queries`` (a model
    with a query mode), else its ``embed`` (one mode for both)."""
    own = getattr(embedder, "embed_queries", None)
    return await (own(texts) if own is not None else embedder.embed(texts))
