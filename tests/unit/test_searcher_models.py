"""A search uses the live generation's model and floor (issue 41): a query
worker whose embedder is another model opens the offline model the
generation names (closing it when done), answers by keyword only when it
cannot, and applies the floor the generation recorded unless
``recall.min_similarity`` is set."""

from __future__ import annotations

from helpers import Letters

from memq.contracts import queries as q
from memq.workers.index.backends.base import IndexMeta
from memq.workers.index.backends.embedded import EmbeddedIndex
from memq.workers.index.embedders.e5 import MODEL as E5_MODEL
from memq.workers.index.embedders.e5 import E5Embedder
from memq.workers.index.embedders.floors import DEFAULT, floor_for
from memq.workers.memory.recall import Doc, search_text
from memq.workers.query.search import Searcher
from memq.workers.settings import RecallSettings, Settings

TEXTS = ["I adopted a golden retriever puppy named Max", "The quarterly tax filing is due next week"]


async def _index(tmp_path, model: str, dim: int, vectors) -> EmbeddedIndex:
    index = EmbeddedIndex(tmp_path / "index.db")
    await index.open()
    gen = await index.create_generation(model, dim, min_similarity=floor_for(model))
    await index.promote(gen.generation)
    docs = [
        Doc(f"ev-{i}", "app", "u", "s", i + 1, "Ann", "user", 1.7e9 + i, t, search_text("Ann", t, 1.7e9 + i), v)
        for i, (t, v) in enumerate(zip(TEXTS, vectors))
    ]
    await index.upsert(docs)
    return index


async def test_a_generation_of_the_other_offline_model_is_searched_with_that_model(tmp_path):
    e5 = E5Embedder()
    index = await _index(tmp_path, E5_MODEL, 384, await e5.embed(TEXTS))
    searcher = Searcher(Settings(data_dir=tmp_path), backend=index, embedder=Letters())  # type: ignore[arg-type]
    try:
        reply = await searcher.search(q.Search(app="app", user="u", query="¿Cómo se llama mi perro?", mode="vector"))
        assert (reply.mode, reply.model, reply.note) == ("vector", E5_MODEL, None)
        assert [r.event_id for r in reply.results][:1] == ["ev-0"]
        opened = searcher._other
        assert opened is not None and opened[0] == E5_MODEL
    finally:
        await searcher.close()
        await e5.close()
    assert searcher._other is None  # closed with the searcher


async def test_a_generation_of_a_model_it_cannot_open_is_answered_by_keyword(tmp_path):
    letters = Letters()
    index = await _index(tmp_path, "openai:text-embedding-3-small", 8, await letters.embed(TEXTS))
    searcher = Searcher(Settings(data_dir=tmp_path), backend=index, embedder=Letters())  # type: ignore[arg-type]
    searcher.embedder.model = "test:other"  # type: ignore[union-attr]
    try:
        reply = await searcher.search(q.Search(app="app", user="u", query="puppy", mode="hybrid"))
        assert reply.mode == "keyword" and "answered by keyword" in (reply.note or "")
        assert [r.event_id for r in reply.results] == ["ev-0"]
    finally:
        await searcher.close()


def test_the_floor_is_the_generations_unless_a_setting_says_otherwise(tmp_path):
    searcher = Searcher(Settings(data_dir=tmp_path))
    recorded = IndexMeta("g1", E5_MODEL, 384, 0.0, 0.75)
    assert searcher.relevance_floor(recorded) == 0.75
    assert searcher.relevance_floor(IndexMeta("g1", E5_MODEL, 384)) == floor_for(E5_MODEL)  # none recorded
    assert searcher.relevance_floor(IndexMeta("g1", "openai:x", 8)) == DEFAULT
    overridden = Searcher(Settings(data_dir=tmp_path, recall=RecallSettings(min_similarity=0.5)))
    assert overridden.relevance_floor(recorded) == 0.5
