"""What the search tests on both index backends share: a promoted index
generation on the embedded index or on a test Weaviate, and a searcher over
it with recall settings of the test's choosing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from memq.workers.index.embedders.floors import floor_for
from memq.workers.query.search import Searcher
from memq.workers.settings import Settings


async def open_index(request: pytest.FixtureRequest, kind: str, tmp_path: Path, embedder):
    """An opened index of ``kind`` ("embedded" or "weaviate") with a promoted
    generation for ``embedder`` (recording its model's floor, as a rebuild
    does); the caller closes it."""
    if kind == "embedded":
        from memq.workers.index.backends.embedded import EmbeddedIndex

        index = EmbeddedIndex(tmp_path / "index.db")
    else:
        from memq.workers.index.backends.weaviate import WeaviateIndex
        from memq.workers.settings import WeaviateSettings

        server = request.getfixturevalue("weaviate_server")
        index = WeaviateIndex(
            WeaviateSettings(url=server.url, grpc_port=server.grpc_port, collection=f"T{uuid.uuid4().hex[:12]}")
        )
    await index.open()
    meta = await index.create_generation(embedder.model, embedder.dim, min_similarity=floor_for(embedder.model))
    await index.promote(meta.generation)
    return index


def searcher(backend, embedder, **recall) -> Searcher:
    """A searcher over ``backend`` with these ``recall`` settings changed."""
    s = Settings()
    s.recall = type(s.recall).model_validate({**s.recall.model_dump(), **recall})
    return Searcher(s, backend=backend, embedder=embedder)
