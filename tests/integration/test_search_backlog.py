"""One app's indexing backlog never stalls another app's searches (issue 38,
finding 3), on both index backends and both SQL backends.

Every app's messages share one stream and one indexing consumer, in stream
order. App A appends thousands of events while the indexing worker embeds
slowly (each batch held back: an honest slow embedder, so the backlog lasts
the test and then drains in seconds); app B appends and searches its own
write with read-your-writes (``min_seq``) again and again. Before the fix
every one of B's searches failed with ``NotCommitted`` after its 2 s wait.
Now each answers at once, holding B's write, from the index plus B's own
unindexed messages (workers/query/stream_unindexed.py); and once the index has
caught up, it answers the same."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

import nats
import pytest
from helpers import (
    Letters,
    make_settings,
    run_memq,
    running,
    running_query,
    running_worker,
    wait_for,
    weaviate_collection,
)

from memq.contracts.client import MemoryClient
from memq.contracts.errors import NotCommitted
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.settings import AppStreamSettings
from memq.workers.status import backlog_text, collect_status

A, B = "backlog-a", "backlog-b"
A_EVENTS = 3000
ROUNDS = 10
# A backstop: B's search answers in ms when idle. Before the fix it raised
# NotCommitted after wait_ms (2 s), which fails the test by itself, so this
# only catches a search that hangs (a loaded 2-core VM embeds the tail slowly).
SEARCH_BOUND_S = 10.0
SEARCH_WAIT_MS = 5_000  # B's own write indexed past A's backlog: a batch or two of the slow embedder

pytestmark = pytest.mark.timeout(300)

NOTES = [
    "I keep bees on the roof of the library",
    "My sister moved to Porto last spring",
    "The violin lessons start on Thursday evenings",
    "We planted tomatoes and basil in the courtyard",
    "Our cat Miso hates the vacuum cleaner",
    "I am training for a half marathon in October",
    "The bakery on the corner sells rye bread with caraway",
    "Grandfather repaired clocks for forty years",
    "My favourite board game is Carcassonne",
    "We watched the eclipse from the lighthouse",
]
QUERIES = ["bees on the roof", "half marathon training", "clocks", "Porto sister", "bread with caraway"]


class Slow(Letters):
    """The letters embedder, each batch held back ``delay_s``: an indexer
    that cannot keep up, until the test lets it (``delay_s = 0``)."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s

    async def embed(self, texts):
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return await super().embed(texts)


def text(body: str, author: str = "user") -> Event:
    return Event(author=author, message=Message(role="user", parts=[TextPart(text=body)]))


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(params=["embedded", "weaviate"])
def settings(request, nats_url, db_url, tmp_path):
    extra = {}
    if request.param == "weaviate":
        server = request.getfixturevalue("weaviate_server")
        extra = {"weaviate": weaviate_collection(server, "B")}
    s = make_settings(nats_url, db_url, tmp_path)
    s.indexing = type(s.indexing).model_validate(
        {
            **s.indexing.model_dump(),
            "backend": request.param,
            "batch_size": 16,
            "batch_wait_s": 0.02,
            "ack_wait_s": 30.0,
            "retry_delays_s": [0.2, 0.5],
            **extra,
        }
    )
    return s


async def test_backlog_of_one_app_does_not_stall_another_apps_search(settings):
    slow = Slow(delay_s=0.25)  # 16 events a batch: A's 3,000 take about 47 s
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_worker(settings))
        indexing = await stack.enter_async_context(running(IndexingWorker(settings), embedder=slow))
        await asyncio.wait_for(indexing.ready.wait(), 60)
        query = await stack.enter_async_context(running_query(settings))
        query.searcher.embedder = Letters()  # the same model as the index, at full speed
        a = await stack.enter_async_context(await MemoryClient.connect(settings.nats.url, app=A))
        b = await stack.enter_async_context(await MemoryClient.connect(settings.nats.url, app=B))

        await b.search("bea", "warm up", min_seq=0)  # the query worker opens the index on its first search
        for start in range(0, A_EVENTS, 500):
            a_last = (
                await a.append_many(
                    "ann", f"s{start}", [text(f"chatter {i} about nothing much") for i in range(start, start + 500)]
                )
            )[-1]
        written: list[tuple[int, str]] = []  # (seq, event id) of B's notes
        answers: dict[str, list[str]] = {}  # query -> event ids, as B got them behind A's backlog
        for i, note in enumerate(NOTES[:ROUNDS]):
            event = text(note, author="Bea")
            seq = await b.append("bea", "notes", event)
            written.append((seq, event.id))
            started = time.monotonic()
            found = await b.search("bea", note, k=5, min_seq=seq)  # raised NotCommitted before the fix
            took = time.monotonic() - started
            assert event.id in [r.event_id for r in found.results], (i, note, found.results)
            assert all(r.metadata["user"] == "bea" for r in found.results)
            assert took < SEARCH_BOUND_S, f"search {i} took {took:.2f}s behind another app's backlog"
        for query_text in QUERIES:
            found = await b.search("bea", query_text, k=5, min_seq=written[-1][0])
            answers[query_text] = [r.event_id for r in found.results]
        # The backlog was there all along: A's events are still waiting.
        assert query.live.of(A).index_floor.value < a_last - 500

        # A, whose own backlog it is, gets an error that says so.
        with pytest.raises(NotCommitted, match=r"of them are this user's own.*min-seq 0"):
            await a.search("ann", "chatter", min_seq=a_last)

        # The CLI searches what is indexed now (--min-seq 0: no wait); base refused 0.
        shown = await run_memq(settings, "search", "chatter", "--user", "ann", "--app", A, "--min-seq", "0", "--json")
        assert shown.returncode == 0, shown.stderr
        assert "chatter" in shown.stdout
        # `memq status` shows the indexing backlog and when it should be done.
        nc = await nats.connect(settings.nats.url)
        try:
            status = await collect_status(nc, settings.streams, wait_s=2.0)
        finally:
            await nc.close()
        behind = next(c for c in status.consumers if c.name == settings.indexing.durable)
        assert behind.backlog > 500 and behind.rate > 0 and behind.eta_s is not None, behind
        assert f"{settings.indexing.durable} {behind.backlog} waiting, about" in backlog_text(status.consumers)

        slow.delay_s = 0  # let the indexer catch up
        floor = query.live.of(A).index_floor

        async def caught_up() -> bool:
            return await floor.refresh() >= written[-1][0]

        await wait_for(caught_up, timeout=120, what="the index catching up")
        for query_text in QUERIES:
            caught_up = await b.search("bea", query_text, k=5, min_seq=written[-1][0])
            ids = [r.event_id for r in caught_up.results]
            # The same memories; the best one first (BM25's corpus statistics
            # are estimated for unindexed memories, so lower ranks may swap).
            assert set(ids) == set(answers[query_text]), query_text
            assert ids[0] == answers[query_text][0], query_text


async def test_with_a_stream_each_another_apps_backlog_is_not_in_front_of_b(nats_url, sqlite_url, tmp_path):
    """With a stream per app (``streams.apps``) each app's messages have an
    indexing consumer of their own: B's writes are indexed while A's
    backlog is still there, so B's search waits on B's own index floor and
    needs no unindexed read at all (``query.search_tail`` 0, so it could
    not fall back on one). On the one shared stream the same searches wait
    behind A's 3,000 events, for about 47 s."""
    s = make_settings(nats_url, sqlite_url, tmp_path)
    s.streams = s.streams.model_copy(update={"apps": {A: AppStreamSettings(), B: AppStreamSettings()}})
    s.indexing = s.indexing.model_copy(update={"backend": "embedded", "batch_size": 16, "batch_wait_s": 0.02})
    s.query = s.query.model_copy(update={"search_tail": 0})
    slow = Slow(delay_s=0.25)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_worker(s))
        indexing = await stack.enter_async_context(running(IndexingWorker(s), embedder=slow))
        await asyncio.wait_for(indexing.ready.wait(), 60)
        query = await stack.enter_async_context(running_query(s))
        query.searcher.embedder = Letters()
        a = await stack.enter_async_context(await MemoryClient.connect(s.nats.url, app=A))
        b = await stack.enter_async_context(await MemoryClient.connect(s.nats.url, app=B, wait_ms=SEARCH_WAIT_MS))

        await b.search("bea", "warm up", min_seq=0)
        for start in range(0, A_EVENTS, 500):
            a_last = (
                await a.append_many(
                    "ann", f"s{start}", [text(f"chatter {i} about nothing much") for i in range(start, start + 500)]
                )
            )[-1]
        for note in NOTES[:ROUNDS]:
            event = text(note, author="Bea")
            seq = await b.append("bea", "notes", event)
            started = time.perf_counter()
            found = await b.search("bea", note, k=3, min_seq=seq)
            took = time.perf_counter() - started
            assert event.id in [r.event_id for r in found.results], f"B's {note!r} not found"
            assert took < SEARCH_BOUND_S, f"B's search took {took:.2f}s"
        a_floor = query.live.of(A).index_floor
        assert await a_floor.refresh() < a_last - 500, "A's backlog drained before B was done: the test proves nothing"
        assert query.live.of(B).index_floor.value >= seq
