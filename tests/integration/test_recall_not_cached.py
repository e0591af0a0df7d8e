"""A context whose recall was skipped (the index failed for a moment, as it
did at a switch of generation) is not cached: the next read recalls again,
rather than being served the context without its memories until the
session's next commit (issue 32)."""

from __future__ import annotations

import json

import pytest
from helpers import Letters, make_settings, running_query, running_worker

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.index.backends.base import IndexUnavailable
from memq.workers.index.backends.embedded import EmbeddedIndex
from memq.workers.memory.recall import Doc, search_text

pytestmark = pytest.mark.timeout(120)

APP, USER = "recall-cache", "alice"
MEMORY = "Max is my golden retriever puppy"


class FailsOnce:
    """An index whose first search fails as an unreachable one does."""

    def __init__(self, inner):
        self.inner, self.failed = inner, False

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def search(self, query, *, generation=None):
        if not self.failed:
            self.failed = True
            raise IndexUnavailable("the index is away for a moment")
        return await self.inner.search(query, generation=generation)


async def test_a_context_whose_recall_was_skipped_is_not_served_from_the_cache(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    assert settings.cache.backend in ("auto", "memory")  # the in-process tier caches contexts
    index = EmbeddedIndex(settings.index_path())
    await index.open()
    embedder = Letters()
    gen = await index.create_generation(embedder.model, embedder.dim)
    await index.promote(gen.generation)
    (vector,) = await embedder.embed([MEMORY])
    ts = 1_700_000_000.0
    await index.upsert(
        [
            Doc(
                id="ev-old",
                app=APP,
                user=USER,
                session="earlier",
                seq=999,  # not a seq of the window (assemble leaves those out)
                author="Alice",
                role="user",
                timestamp=ts,
                text=MEMORY,
                search_text=search_text("Alice", MEMORY, ts),
                vector=vector,
            )
        ]
    )
    flaky = FailsOnce(index)
    async with running_worker(settings), running_query(settings) as query:
        query.searcher.backend, query.searcher.embedder = flaky, embedder
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seq = await client.append(
                USER,
                "s1",
                Event(
                    author="Alice", message=Message(role="user", parts=[TextPart(text="my golden retriever puppy?")])
                ),
            )
            first = await client.context(USER, "s1", min_seq=seq)
            assert flaky.failed and MEMORY not in json.dumps(first.model_dump()), "the first recall was not skipped"
            second = await client.context(USER, "s1", min_seq=seq)
            assert MEMORY in json.dumps(second.model_dump()), "the context without its recall was served again"
