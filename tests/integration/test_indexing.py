"""The indexing worker end to end on real NATS and SQL, with the local
embedder: client publish → stream → indexing worker → index → search and
recall through the query worker; deletes, storage scopes, rebuilds and model
changes. Backend-specific behaviour is in test_index_contract.py; Weaviate
outages in test_indexing_weaviate.py."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from helpers import (
    SharedEmbedder,
    make_settings,
    running,
    running_query,
    running_worker,
    wait_for,
    wait_indexed,
    weaviate_collection,
)

from memq.contracts.client import MemoryClient
from memq.contracts.errors import NotCommitted, Unavailable
from memq.contracts.schemas import CheckpointSaved, Event, Message, TextPart, ToolCallPart, ToolResultPart
from memq.contracts.tools import SEARCH_MEMORY, run_search_memory
from memq.workers.index.backends import open_backend
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.indexing.indexer import make_indexer
from memq.workers.indexing.rebuild import rebuild
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.settings import LocalEmbedderSettings
from memq.workers.sql.engine import create_engine

APP = "idx-app"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def embedder():
    return LocalEmbedder(LocalEmbedderSettings())


class Renamed:
    """The local embedder under another model name: a model change."""

    def __init__(self, inner, model: str):
        self.inner, self.model, self.dim = inner, model, inner.dim

    async def embed(self, texts):
        return await self.inner.embed(texts)

    async def close(self) -> None:
        pass


def text(role: str, body: str, author: str | None = None, ts: float | None = None) -> Event:
    extra = {"timestamp": ts} if ts is not None else {}
    return Event(author=author or role, message=Message(role=role, parts=[TextPart(text=body)]), **extra)


def settings_for(nats_url, sqlite_url, tmp_path, **indexing):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    s.indexing = type(s.indexing).model_validate(
        {**s.indexing.model_dump(), "retry_delays_s": [0.2, 0.5], "batch_wait_s": 0.05, **indexing}
    )
    return s


@asynccontextmanager
async def stack(settings, embedder, *, query: bool = True):
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_worker(settings))
        indexing = await stack.enter_async_context(running(IndexingWorker(settings), embedder=SharedEmbedder(embedder)))
        await asyncio.wait_for(indexing.ready.wait(), 60)
        q = await stack.enter_async_context(running_query(settings)) if query else None
        if q is not None:
            q.searcher.embedder = SharedEmbedder(embedder)  # no second copy of the model
        yield indexing, q


async def indexed(client: MemoryClient, seq: int) -> None:
    """Until everything up to ``seq`` is indexed (the indexing consumer's floor)."""
    await wait_indexed(client, seq)


async def test_publish_index_search(nats_url, sqlite_url, tmp_path, embedder):
    s = settings_for(nats_url, sqlite_url, tmp_path)
    async with stack(s, embedder):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append_many(
                "alice",
                "s1",
                [
                    text("user", "I adopted a golden retriever puppy named Max", author="Alice"),
                    text("assistant", "How lovely! How old is Max?"),
                    text("user", "We are flying to Lisbon in June for my sister's wedding", author="Alice"),
                ],
            )
            seq = await client.append("bob", "s1", text("user", "My dog is called Rex", author="Bob"))
            await indexed(client, seq)
            queries = {"keyword": "puppy", "vector": "What is the name of my dog?", "hybrid": "my puppy dog"}
            for mode, query in queries.items():
                found = await client.search("alice", query, mode=mode, k=3)
                assert found.mode == mode and found.model == embedder.model
                assert found.results[0].content == "I adopted a golden retriever puppy named Max", mode
                assert all(r.metadata["user"] == "alice" for r in found.results)  # never Bob's Rex
                assert [r.score for r in found.results] == sorted((r.score for r in found.results), reverse=True)
            # (bare "travel plans" is 0.35 from the Lisbon turn: under the relevance floor, recall.min_similarity)
            trip = await client.search("alice", "travel plans for a wedding", k=1, authors=["Alice"])
            assert "Lisbon" in trip.results[0].content
            assert (await client.search("alice", "Lisbon", roles=["assistant"], mode="keyword")).results == []
            # the agent tool
            assert SEARCH_MEMORY["function"]["name"] == "search_memory"
            answer = await run_search_memory(client, "alice", '{"query": "wedding", "limit": 1}')
            assert "Lisbon" in answer and answer.startswith("- [")


async def test_other_apps_never_see_results(nats_url, sqlite_url, tmp_path, embedder):
    s = settings_for(nats_url, sqlite_url, tmp_path)
    async with stack(s, embedder):
        async with (
            await MemoryClient.connect(nats_url, app=APP) as a,
            await MemoryClient.connect(nats_url, app="other") as b,
        ):
            seq = await a.append("alice", "s", text("user", "secret plans for the heist"))
            await b.append("alice", "s", text("user", "nothing to see"))
            await indexed(a, seq)
            assert (await a.search("alice", "heist")).results
            assert all("heist" not in r.content for r in (await b.search("alice", "heist")).results)


async def test_deletes_are_followed(nats_url, sqlite_url, tmp_path, embedder):
    s = settings_for(nats_url, sqlite_url, tmp_path)
    async with stack(s, embedder):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("alice", "s1", text("user", "the blue umbrella is in the car"))
            await client.append("alice", "s2", text("user", "the red umbrella is at work"))
            await client.append("carol", "s1", text("user", "carol lost her umbrella"))
            seq = await client.delete_session("alice", "s1")
            await indexed(client, seq)
            found = await client.search("alice", "umbrella", mode="keyword")
            assert [r.content for r in found.results] == ["the red umbrella is at work"]
            # recreated after its delete: the new event stays
            seq = await client.append("alice", "s1", text("user", "a green umbrella now"))
            seq = await client.delete_user("alice")
            seq = await client.append("carol", "s2", text("user", "still here"))
            await indexed(client, seq)
            assert (await client.search("alice", "umbrella", mode="keyword")).results == []
            assert len((await client.search("carol", "umbrella", mode="keyword")).results) == 1


def _tool_call_pair() -> list[Event]:
    return [
        Event(
            author="bot",
            message=Message(role="assistant", parts=[ToolCallPart(id="c1", name="weather", args={"city": "Oslo"})]),
        ),
        Event(
            author="weather",
            message=Message(role="tool", parts=[ToolResultPart(id="c1", name="weather", result="snowing in Oslo")]),
        ),
    ]


@pytest.mark.parametrize(
    "scope, expected",
    [
        ("all", {"user", "assistant", "tool", "summary"}),
        ("conversational", {"user", "summary"}),
        ("summaries_only", {"summary"}),
    ],
)
async def test_storage_scope(nats_url, sqlite_url, tmp_path, embedder, scope, expected):
    s = settings_for(nats_url, sqlite_url, tmp_path, storage_scope=scope)
    async with stack(s, embedder) as (indexing, _):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("alice", "s", text("user", "what is the weather in Oslo?"))
            await client.append_many("alice", "s", _tool_call_pair())
            seq = await client._publish(
                CheckpointSaved(
                    app=APP, user="alice", session="s", summary="Alice asked about Oslo weather.", up_to_seq=3
                )
            )
            await indexed(client, seq)
            found = await client.search("alice", "Oslo weather", mode="keyword", k=10)
            assert {r.metadata["role"] for r in found.results} == expected


@pytest.mark.parametrize("backend", ["embedded", pytest.param("weaviate", marks=pytest.mark.services)])
async def test_rebuild_from_stream_and_sql_equals_live(nats_url, sqlite_url, tmp_path, embedder, backend, request):
    extra = {}
    if backend == "weaviate":
        server = request.getfixturevalue("weaviate_server")
        extra = {"weaviate": weaviate_collection(server, "R")}
    s = settings_for(nats_url, sqlite_url, tmp_path, backend=backend, **extra)
    async with stack(s, embedder, query=False) as (indexing, _):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            for user in ("alice", "bob"):
                for session in ("s1", "s2", "s3"):
                    await client.append_many(
                        user, session, [text("user", f"{user} note {i} in {session}") for i in range(5)]
                    )
            await client.delete_session("alice", "s2", missing_ok=True)  # no query service here
            seq = await client.delete_user("bob", missing_ok=True)
            await client.append("bob", "again", text("user", "bob is back"))
            seq = await client.append("alice", "s1", text("user", "last words"))
            await wait_for(lambda: _indexed_to(indexing, seq), what="indexing")
        backend = indexing.live.backend

        async def snapshot():
            return {
                (d.id, d.session, d.seq, d.text, d.search_text, tuple(round(x, 4) for x in d.vector))
                async for d in backend.export()
            }

        live = await snapshot()
        assert len(live) == 5 * 2 + 1 + 1  # alice s1, s3 (+ last words), bob's new session
        contexts = {d[4].split("\n", 1)[1] if "\n" in d[4] else None for d in live if d[0]}
        assert "(after user: alice note 4 in s1)" in contexts  # "last words" follows note 4
        js = indexing.live.js
        engine = create_engine(s.database_url())
        try:
            indexer = make_indexer(s, backend, SharedEmbedder(embedder), js, engine=engine)
            first = (await backend.live()).generation
            result = await rebuild(s, indexing.nc, indexer, source="stream")
            assert result.generation != first and (await backend.live()).generation == result.generation
            assert await snapshot() == live
            result = await rebuild(s, indexing.nc, indexer, source="sql", engine=engine)
            assert await snapshot() == live
            # scoped: only alice is replayed, the rest is copied
            result = await rebuild(s, indexing.nc, indexer, app=APP, user="alice")
            assert result.copied == 1 and await snapshot() == live
            assert len(await backend.generations()) == 1  # old generations were dropped
        finally:
            await engine.dispose()


async def _indexed_to(worker: IndexingWorker, seq: int) -> bool:
    info = await worker.live.js.consumer_info(worker.settings.streams.events, worker.settings.indexing.durable)
    return info.ack_floor.stream_seq >= seq


async def test_a_model_change_is_detected_and_rebuilds(nats_url, sqlite_url, tmp_path, embedder):
    s = settings_for(nats_url, sqlite_url, tmp_path)
    async with stack(s, embedder) as (indexing, query):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seq = await client.append("alice", "s", text("user", "the spare key is under the flower pot"))
            await indexed(client, seq)
            old = await indexing.live.backend.live()
            # A worker with another model: it must not write into this index.
            other = IndexingWorker(s)
            async with running(other, embedder=Renamed(embedder, "local:renamed-model")):
                await asyncio.wait_for(other.ready.wait(), 60)
                new = await other.live.backend.live()
                assert new.model == "local:renamed-model" and new.generation != old.generation
                assert await other.live.backend.count() == 1  # rebuilt from the stream
                # The query worker still embeds with the old model: keyword, said so.
                query.searcher._live = None
                found = await client.search("alice", "where is the key?")
                assert found.mode == "keyword" and found.note and "renamed-model" in found.note
                # The old-model worker stops writing rather than mix vectors:
                # whichever replica the event reaches, only the new model indexes it.
                before = indexing.indexed
                await client.append("alice", "s", text("user", "a second fact about keys"))

                async def both_indexed() -> bool:
                    return await other.live.backend.count() == 2

                await wait_for(both_indexed, timeout=30, what="the new model's worker to index it")
                assert indexing.indexed == before


async def test_search_without_an_index_is_a_typed_error(nats_url, sqlite_url, tmp_path):
    s = settings_for(nats_url, sqlite_url, tmp_path)
    async with running_worker(s), running_query(s):
        async with await MemoryClient.connect(nats_url, app=APP, wait_ms=300) as client:
            with pytest.raises(Unavailable, match="no index"):
                await client.search("alice", "anything")
            # After a write, search would wait for its indexing (read-your-writes),
            # but with no index there is nothing to wait for: it says so at once.
            await client.append("alice", "s", text("user", "nobody indexes this"))
            with pytest.raises(Unavailable, match="no index"):
                await asyncio.wait_for(client.search("alice", "anything"), 5)
            with pytest.raises(Unavailable, match="no index"):  # min_seq=0: no wait
                await client.search("alice", "anything", min_seq=0)


async def test_search_with_its_indexer_stopped_is_a_typed_error(nats_url, sqlite_url, tmp_path, embedder):
    """An index exists but nothing indexes the caller's new write: the wait
    ends within wait_ms with a typed error that says why, no hang. (With
    query.search_tail, the default, the caller's few unindexed writes are
    searched from the stream instead: test_search_backlog.py.)"""
    s = settings_for(nats_url, sqlite_url, tmp_path)
    s.query = s.query.model_copy(update={"search_tail": 0})
    async with running_worker(s), running_query(s) as q:
        q.searcher.embedder = SharedEmbedder(embedder)
        async with await MemoryClient.connect(nats_url, app=APP, wait_ms=300) as client:
            async with running(IndexingWorker(s), embedder=SharedEmbedder(embedder)) as indexing:
                await asyncio.wait_for(indexing.ready.wait(), 60)
                await client.append("alice", "s", text("user", "indexed"))
                await client.search("alice", "indexed")
            await client.append("alice", "s", text("user", "nobody indexes this"))
            with pytest.raises(NotCommitted, match="not indexed yet"):
                await asyncio.wait_for(client.search("alice", "anything"), 5)


async def search_after_each_append(client: MemoryClient, user: str, modes=("hybrid", "keyword")) -> None:
    """Append, then at once search for a word only that event has, with no
    explicit min_seq: the search sees the caller's own write every time
    (before the default waited for it, 20 of 20 such searches missed)."""
    for i in range(20):
        word = f"zq{uuid.uuid4().hex[:8]}"  # one token, in no other event
        await client.append(user, "ryw", text("user", f"note {i}: the code word is {word}"))
        found = await client.search(user, word, mode=modes[i % len(modes)], k=5)
        assert any(word in r.content for r in found.results), (i, found)


async def test_a_search_right_after_an_append_finds_it(nats_url, sqlite_url, tmp_path, embedder):
    s = settings_for(nats_url, sqlite_url, tmp_path)
    async with stack(s, embedder):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await search_after_each_append(client, "alice")
            # Opting out: min_seq=0 searches what is indexed now, without waiting.
            word = f"zq{uuid.uuid4().hex[:8]}"
            seq = await client.append("alice", "ryw", text("user", f"the code word is {word}"))
            await client.search("alice", word, min_seq=0)  # answers (found or not: it raced the indexer)
            found = await client.search("alice", word, mode="keyword", min_seq=seq)
            assert [r.content for r in found.results] == [f"the code word is {word}"]


async def test_the_indexing_floor_moves_on_the_indexing_notices(nats_url, sqlite_url, tmp_path, embedder):
    """With the ack-floor fallback made an hour long, a search waiting for
    a write is still answered: the indexing replicas' notices woke it."""
    s = settings_for(nats_url, sqlite_url, tmp_path)
    s.query = s.query.model_copy(update={"search_tail": 0})  # every search waits for the index
    async with stack(s, embedder) as (_, query):
        floor = query.live.of(APP).index_floor
        floor.poll_from_s = floor.poll_max_s = 3600.0
        read_at = floor._read_at  # when the ack floor was last read (the worker's start)
        # wait_ms far below the fallback: a search is answered by a notice, or fails
        async with await MemoryClient.connect(nats_url, app=APP, wait_ms=20_000) as client:
            for i in range(5):
                word = f"zq{uuid.uuid4().hex[:8]}"
                seq = await client.append("alice", "n", text("user", f"fact {i}: {word}"))
                found = await client.search("alice", word, mode="keyword")
                assert found.results and word in found.results[0].content
                assert floor.value >= seq
        assert floor._read_at == read_at  # the ack floor was never read again
        if floor._poller is not None:  # asleep for the hour
            floor._poller.cancel()


async def test_context_recalls_memories_from_other_sessions(nats_url, sqlite_url, tmp_path, embedder):
    s = settings_for(nats_url, sqlite_url, tmp_path)
    async with stack(s, embedder):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append_many(
                "alice",
                "old",
                [
                    text("user", "My daughter's name is Emma and she is 7", author="Alice"),
                    text("user", "I work as a nurse at the city hospital", author="Alice"),
                ],
            )
            await client.append("alice", "new", text("assistant", "Hi again! How can I help?"))
            seq = await client.append("alice", "new", text("user", "What should I get my daughter for her birthday?"))
            await indexed(client, seq)
            ctx = await client.context("alice", "new", recall_limit=1)
            assert ctx.tokens["recalled"] > 0
            recalled = ctx.context["recalled"]
            assert len(recalled) == 1 and "Emma" in recalled[0]["event"]["message"]["parts"][0]["text"]
            assert ctx.messages[0]["role"] == "system" and "Emma" in ctx.messages[0]["content"]
            # what the window holds is never recalled again
            ctx = await client.context("alice", "new", recall_limit=5)
            window_seqs = {e["seq"] for e in ctx.context["window"]}
            assert not window_seqs & {r["seq"] for r in ctx.context["recalled"]}
            assert (await client.context("alice", "new", recall_limit=0)).tokens["recalled"] == 0
            # a message not stored yet: placed last, counted, and what recall searches with
            ctx = await client.context(
                "alice", "new", recall_limit=1, format="openai", message="Where do I work again?"
            )
            assert ctx.messages[-1] == {"role": "user", "content": "Where do I work again?"}
            assert "nurse" in ctx.messages[0]["content"]
            assert ", Alice] I work as a nurse" in ctx.messages[0]["content"]  # who said it, with the date
            # the recall share is the app's default unless the request names one
            ctx = await client.context("alice", "new", strategy={"recall_share": 0.9})
            assert ctx.context["strategy"]["recall_share"] == 0.9 and ctx.context["recalled"]


async def test_an_unexpected_error_while_preparing_is_said_and_retried(
    nats_url, sqlite_url, tmp_path, embedder, caplog
):
    """Preparing the index once ended its background task in silence on any
    error but an outage (seen with two replicas creating the first
    generation at once on an empty Weaviate): the replica said "preparing"
    for ever. It now logs what failed and tries again."""
    s = settings_for(nats_url, sqlite_url, tmp_path)
    backend = open_backend(s)
    real_open, failures = backend.open, [RuntimeError("the other replica's half-made alias")]

    async def open_once_failing() -> None:
        if failures:
            raise failures.pop()
        await real_open()

    backend.open = open_once_failing  # type: ignore[method-assign]
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_worker(s))
        indexing = await stack.enter_async_context(
            running(IndexingWorker(s), index=backend, embedder=SharedEmbedder(embedder))
        )
        await asyncio.wait_for(indexing.ready.wait(), 60)
    assert not failures
    assert "preparing the index failed (RuntimeError: the other replica's half-made alias)" in caplog.text
