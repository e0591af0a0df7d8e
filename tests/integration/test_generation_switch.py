"""A search in flight when the live index generation switches answers from
the old or the new generation: never an error, never an empty answer, on
both backends (issue 32, "no blip").

The switch runs on a second backend object over the same index (its own
SQLite connection, its own Weaviate client), as ``memq index rebuild`` runs
in a process of its own: the searcher's view of the generations is then as
stale as a query worker's is. The search is paused by a hook between
resolving its generation and reading it, so the test does not depend on
timing."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import pytest
from search_stack import searcher

from memq.contracts import queries as q
from memq.workers.index.backends.base import IndexBackend
from memq.workers.memory.recall import Doc, search_text

WEAVIATE = pytest.mark.services  # its server comes through getfixturevalue, unseen by conftest's marking
APP, USER = "switch-app", "alice"
TEXTS = ["I adopted a golden retriever puppy named Max", "We fly to Lisbon in June", "My sister paints"]


class Letters:
    """A tiny deterministic embedder (no model to load): letter counts."""

    model, dim = "test:letters", 8

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [[float(sum(ord(c) % self.dim == i for c in t.lower())) + 0.1 for i in range(self.dim)] for t in texts]

    async def close(self) -> None:
        pass


class PausedBeforeRead:
    """``inner`` whose next search first awaits ``before`` (once): the
    searcher has resolved the generation it names, and has not read it yet."""

    def __init__(self, inner: IndexBackend, before: Callable[[], Awaitable[None]]):
        self.inner, self.before = inner, before
        self.generations_searched: list[str | None] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def search(self, query, *, generation=None):
        if self.before is not None:
            before, self.before = self.before, None
            await before()
        self.generations_searched.append(generation)
        return await self.inner.search(query, generation=generation)


def _backend(kind: str, request: pytest.FixtureRequest, tmp_path, collection: str) -> IndexBackend:
    if kind == "embedded":
        from memq.workers.index.backends.embedded import EmbeddedIndex

        return EmbeddedIndex(tmp_path / "index.db")
    from memq.workers.index.backends.weaviate import WeaviateIndex
    from memq.workers.settings import WeaviateSettings

    server = request.getfixturevalue("weaviate_server")
    return WeaviateIndex(
        WeaviateSettings(url=server.url, grpc_port=server.grpc_port, collection=collection, scoping=kind.split("-")[1])
    )


async def _docs(embedder: Letters, tag: str) -> list[Doc]:
    """The corpus, each text marked with the generation it was written to."""
    texts = [f"{t} ({tag})" for t in TEXTS]
    vectors = await embedder.embed(texts)
    return [
        Doc(
            id=f"ev-{i}",
            app=APP,
            user=USER,
            session="s1",
            seq=i + 1,
            author="Alice",
            role="user",
            timestamp=1_700_000_000.0 + i,
            text=t,
            search_text=search_text("Alice", t, 1_700_000_000.0 + i),
            vector=v,
        )
        for i, (t, v) in enumerate(zip(texts, vectors, strict=True))
    ]


@pytest.fixture(
    params=[
        "embedded",
        pytest.param("weaviate-filter", marks=WEAVIATE),
        pytest.param("weaviate-tenant", marks=WEAVIATE),
    ]
)
async def two_views(request, tmp_path):
    """(the query worker's backend, the rebuild's backend) over one index
    whose live generation holds the corpus tagged "old"."""
    collection = f"S{uuid.uuid4().hex[:12]}"
    reader = _backend(request.param, request, tmp_path, collection)
    rebuilder = _backend(request.param, request, tmp_path, collection)
    await reader.open()
    await rebuilder.open()
    embedder = Letters()
    old = await rebuilder.create_generation(embedder.model, embedder.dim)
    await rebuilder.upsert(await _docs(embedder, "old"), generation=old.generation)
    await rebuilder.promote(old.generation)
    try:
        yield reader, rebuilder
    finally:
        for g in await rebuilder.generations():
            if g.generation != (await rebuilder.live()).generation:
                await rebuilder.drop_generation(g.generation)
        await reader.close()
        await rebuilder.close()


@pytest.mark.parametrize("mode", ["keyword", "vector", "hybrid"])
async def test_a_search_whose_generation_is_dropped_before_it_reads_answers_from_the_new_one(two_views, mode):
    reader, rebuilder = two_views
    embedder = Letters()
    old = await reader.live()
    new = await rebuilder.create_generation(embedder.model, embedder.dim)
    await rebuilder.upsert(await _docs(embedder, "new"), generation=new.generation)

    async def switch() -> None:  # the rebuild goes live and drops the old generation
        await rebuilder.promote(new.generation)
        assert old.generation not in {g.generation for g in await rebuilder.generations()}

    paused = PausedBeforeRead(reader, switch)
    s = searcher(paused, embedder, min_similarity=0.0)
    await s.live()  # resolved before the switch, as a query worker has it cached
    found = await s.search(q.Search(app=APP, user=USER, query="golden retriever puppy", mode=mode, k=3))
    assert paused.generations_searched[0] == old.generation, "the hook did not pause the search on the old generation"
    assert found.results, "an empty answer across the switch"
    # every hit from one generation: the new one, the old being gone
    assert {r.content.rsplit(" ", 1)[1] for r in found.results} == {"(new)"}
    assert (await s.live()).generation == new.generation


async def test_a_generation_missing_without_a_switch_is_unavailable_without_detail(two_views, caplog, monkeypatch):
    """The live generation itself missing (no switch to follow) is an error,
    whose message names no file or server; the log has the detail."""
    from memq.contracts.errors import Unavailable

    reader, _ = two_views
    live = await reader.live()
    s = searcher(reader, Letters())
    ghost = type(live)(generation=live.generation + "9", model=live.model, dim=live.dim)

    async def stays(*, fresh: bool = False):  # a live generation that does not exist, and stays "live"
        return ghost

    monkeypatch.setattr(s, "live", stays)
    with pytest.raises(Unavailable) as caught:
        await s.search(q.Search(app=APP, user=USER, query="puppy", mode="keyword", k=3))
    assert caught.value.message == "search: the index is unavailable, retry later"
    assert any(ghost.generation in r.getMessage() for r in caplog.records), "the log lacks the detail"
