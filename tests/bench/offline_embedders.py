"""The offline embedders, as the benchmarks call them in their own thread:
memories embedded as the indexing worker embeds them, questions as a search
embeds them (e5 with its ``passage: `` and ``query: `` prefixes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from memq.workers.settings import E5EmbedderSettings, LocalEmbedderSettings

KINDS = ("local", "e5")  # indexing.embedder's offline values: MiniLM, multilingual-e5-small


@dataclass
class Offline:
    kind: str
    model: str
    docs: Callable[[Sequence[str]], np.ndarray]
    queries: Callable[[Sequence[str]], np.ndarray]


def offline(kind: str, threads: int = 0) -> Offline:
    """The ``kind`` embedder (``indexing.embedder``: ``local`` or ``e5``)."""
    if kind == "e5":
        from memq.workers.index.embedders.e5 import E5Embedder

        e5 = E5Embedder(E5EmbedderSettings(threads=threads))
        return Offline(kind, e5.model, e5.embed_sync, lambda texts: e5.embed_sync(texts, query=True))
    from memq.workers.index.embedders.minilm import LocalEmbedder

    minilm = LocalEmbedder(LocalEmbedderSettings(threads=threads))
    return Offline(kind, minilm.model, minilm.embed_sync, minilm.embed_sync)
