"""What a search returns around its ranking, on both backends with the real
embedder: only memories that relate to the query (the relevance floor), and
equal scores in one order, the same for every k and every backend."""

from __future__ import annotations

import pytest
from search_stack import open_index, searcher

from memq.contracts import queries as q
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.memory.recall import Doc, search_text
from memq.workers.query.search import Searcher
from memq.workers.settings import LocalEmbedderSettings

APP = "relevance-app"
TS = 1_683_504_000.0

SESSION_1 = ["The ADK is a great toolkit.", "I agree. The Agent Development Kit (ADK) rocks!"]
SESSION_2 = ["I like to code in Python."]
# 20 notes that tie on "work", then the one that matches every word, stored last.
NOTES = [f"note {i} about work" for i in range(20)] + ["the backlog note about work"]


@pytest.fixture(scope="module")
def embedder():
    return LocalEmbedder(LocalEmbedderSettings())


@pytest.fixture(params=["embedded", pytest.param("weaviate", marks=pytest.mark.services)])
async def backend(request, tmp_path, embedder):
    index = await open_index(request, request.param, tmp_path, embedder)
    docs = []
    for user, session, texts in [("alice", "s1", SESSION_1), ("alice", "s2", SESSION_2), ("carol", "notes", NOTES)]:
        for i, text in enumerate(texts):
            # The notes all share one timestamp, as ADK's test events do: only their order of addition differs.
            ts = TS if user == "carol" else TS + 60 * len(docs)
            docs.append(
                Doc(
                    f"{session}-{i}", APP, user, session, i + 1, "user", "user", ts, text, search_text("user", text, ts)
                )
            )
    vectors = await embedder.embed([d.search_text for d in docs])
    await index.upsert([d.with_vector(v) for d, v in zip(docs, vectors, strict=True)])
    try:
        yield index
    finally:
        await index.close()


async def texts(s: Searcher, query: str, user: str = "alice", **kw) -> list[str]:
    reply = await s.search(q.Search(app=APP, user=user, query=query, **kw))
    return [r.content for r in reply.results]


@pytest.mark.parametrize("mode", ["hybrid", "vector", "keyword"])
async def test_a_query_sharing_nothing_with_the_memories_returns_nothing(backend, embedder, mode):
    s = searcher(backend, embedder)
    assert await texts(s, "nonexistent", mode=mode) == []
    assert await texts(s, "quarterly tax deadline", mode=mode) == []


async def test_recall_for_a_context_uses_the_same_floor(backend, embedder):
    s = searcher(backend, embedder)
    assert await s.recall(APP, "alice", "nonexistent", k=5) == []  # an unrelated memory never costs budget
    assert [h.doc.text for h in await s.recall(APP, "alice", "Python", k=5)] == ["I like to code in Python."]


async def test_related_memories_still_come_back(backend, embedder):
    s = searcher(backend, embedder)
    assert await texts(s, "Python") == ["I like to code in Python."]
    assert set(await texts(s, "How about ADK?")) == set(SESSION_1)
    assert await texts(s, "secret") == []


async def test_the_floor_can_be_turned_off(backend, embedder):
    s = searcher(backend, embedder, min_similarity=-1.0)
    assert len(await texts(s, "nonexistent", mode="vector")) == 3  # every memory of alice's, nearest first


@pytest.mark.parametrize("speaker_aware", [True, False])
async def test_ties_keep_the_order_of_addition_on_every_page(backend, embedder, speaker_aware):
    s = searcher(backend, embedder, speaker_aware=speaker_aware)
    expected = [NOTES[-1]] + NOTES[:20]
    for k in (3, 10, 21):
        assert await texts(s, "work backlog note", user="carol", mode="keyword", k=k) == expected[:k]
    again = await texts(s, "work backlog note", user="carol", mode="keyword", k=10)
    assert again == expected[:10]
