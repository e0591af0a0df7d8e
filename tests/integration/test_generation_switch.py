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

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import pytest
from helpers import Letters, make_settings, running, running_query, running_worker, wait_for, weaviate_collection
from search_stack import searcher

from memq.contracts import queries as q
from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.index.backends import open_backend
from memq.workers.index.backends.base import IndexBackend
from memq.workers.indexing.indexer import make_indexer
from memq.workers.indexing.rebuild import rebuild
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.memory.recall import Doc, SearchQuery, search_text
from memq.workers.sql.engine import create_engine

WEAVIATE = pytest.mark.services  # its server comes through getfixturevalue, unseen by conftest's marking
APP, USER = "switch-app", "alice"
TEXTS = ["I adopted a golden retriever puppy named Max", "We fly to Lisbon in June", "My sister paints"]


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


async def test_a_backend_reports_a_generation_dropped_elsewhere_as_unknown(two_views):
    """Not as an outage: the Weaviate client that searched it (its description
    cached) is not counted as failing, which would have it replaced."""
    from memq.workers.index.backends.base import UnknownGeneration

    reader, rebuilder = two_views
    embedder = Letters()
    old = await reader.live()
    query = SearchQuery(app=APP, user=USER, text="puppy", mode="keyword", k=3)
    assert await reader.search(query, generation=old.generation)  # what the reader knows of it is cached now
    new = await rebuilder.create_generation(embedder.model, embedder.dim)
    await rebuilder.promote(new.generation)
    with pytest.raises(UnknownGeneration):
        await reader.search(query, generation=old.generation)
    assert getattr(reader, "_failing_since", None) is None


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


# --- a whole rebuild, through the query worker ----------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["embedded", pytest.param("weaviate", marks=WEAVIATE)])
async def test_searches_every_few_ms_through_a_whole_rebuild_never_fail_nor_come_back_empty(
    nats_url, sqlite_url, tmp_path, backend, request
):
    """A client searches every ~5 ms while ``rebuild`` replays the stream
    into a new generation and switches to it; the rebuild runs on a backend
    of its own, as ``memq index rebuild`` does in its own process."""
    s = make_settings(nats_url, sqlite_url, tmp_path)
    extra = {}
    if backend == "weaviate":
        server = request.getfixturevalue("weaviate_server")
        extra = {"weaviate": weaviate_collection(server, "B")}
    s.indexing = type(s.indexing).model_validate(
        {**s.indexing.model_dump(), "backend": backend, "batch_wait_s": 0.05, **extra}
    )
    embedder = Letters()
    async with (
        running_worker(s),
        running(IndexingWorker(s), embedder=embedder) as indexing,
        running_query(s) as query,
        await MemoryClient.connect(nats_url, app=APP) as client,
    ):
        await asyncio.wait_for(indexing.ready.wait(), 60)
        query.searcher.embedder = embedder
        for session in ("s1", "s2", "s3", "s4"):
            seqs = await client.append_many(
                USER,
                session,
                [
                    Event(author="Alice", message=Message(role="user", parts=[TextPart(text=f"note {i} on {t}")]))
                    for i, t in enumerate(TEXTS * 10)
                ],
            )
        await client.search(USER, "note", mode="keyword", min_seq=max(seqs))  # all indexed
        before = (await indexing.live.backend.live()).generation

        answers: list[tuple[float, int]] = []  # (when, hits)
        errors: list[str] = []
        done = asyncio.Event()

        async def search_all_along() -> None:
            modes = ("keyword", "hybrid")
            while not done.is_set():
                try:
                    found = await client.search(USER, "golden retriever puppy", mode=modes[len(answers) % 2], k=5)
                    answers.append((time.monotonic(), len(found.results)))
                except Exception as exc:  # noqa: BLE001 - any error is what this test looks for
                    errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.005)

        searching = asyncio.create_task(search_all_along())
        own = open_backend(s)  # the rebuild's own backend (its own connection or client)
        await own.open()
        engine = create_engine(s.database_url())
        try:
            await wait_for(lambda: _some(answers), what="the first answers")
            started = time.monotonic()
            result = await rebuild(s, indexing.nc, make_indexer(s, own, embedder, indexing.live.js, engine=engine))
            switched = time.monotonic()
            await asyncio.sleep(3)  # past the query worker's LIVE_REFRESH_S: it has seen the switch
        finally:
            done.set()
            await searching
            await own.close()
            await engine.dispose()
        assert result.generation != before and (await indexing.live.backend.live()).generation == result.generation
        during = [n for t, n in answers if started < t <= switched]
        after = [n for t, n in answers if t > switched]
        print(f"{len(answers)} answers ({len(during)} during the rebuild, {len(after)} after), {len(errors)} errors")
        assert not errors, errors[:5]
        assert all(n > 0 for _, n in answers), "an empty answer"
        assert during and after, "no search crossed the rebuild and its switch"


async def _some(answers: list) -> bool:
    return bool(answers)
