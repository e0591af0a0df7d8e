"""Forgetting one event (MemoryClient.forget_event) against a real stack: its
own nats-server, SQLite, and the persistence, indexing (embedded,
keyword-only) and query workers in this process. The event leaves history,
context, search and the stream; every other event stays; repeats are no-ops;
a forget that names no event of its session changes nothing; a persistence
worker that dies between its SQL commit and the stream delete still ends
with the event forgotten."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import nats
import pytest
from helpers import make_settings, running, running_query, wait_for
from nats.js.errors import NotFoundError
from services import NatsServer

from memq.contracts.client import MemoryClient
from memq.contracts.errors import InvalidMessage, NotFound
from memq.contracts.subjects import EVENTS_STREAM
from memq.workers.index.embedders import open_embedder
from memq.workers.indexing.indexer import make_indexer
from memq.workers.indexing.rebuild import rebuild
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.persistence.worker import PersistenceWorker
from memq.workers.sql.engine import create_engine

APP = "forget_app"

pytestmark = pytest.mark.timeout(240)


class Stack:
    def __init__(self, url: str, settings, persistence: PersistenceWorker, indexing: IndexingWorker):
        self.url, self.settings, self.persistence, self.indexing = url, settings, persistence, indexing


@pytest.fixture(scope="module")
async def stack(tmp_path_factory) -> AsyncIterator[Stack]:
    data_dir = tmp_path_factory.mktemp("forget")
    with NatsServer() as server:
        settings = make_settings(server.url, f"sqlite+aiosqlite:///{data_dir}/memq.db", data_dir)
        settings.indexing = type(settings.indexing).model_validate(
            {**settings.indexing.model_dump(), "embedder": "none", "backend": "embedded", "batch_wait_s": 0.05}
        )
        async with AsyncExitStack() as exits:
            persistence = await exits.enter_async_context(running(PersistenceWorker(settings)))
            indexing = await exits.enter_async_context(running(IndexingWorker(settings)))
            await asyncio.wait_for(indexing.ready.wait(), 60)
            await exits.enter_async_context(running_query(settings))
            yield Stack(server.url, settings, persistence, indexing)


@pytest.fixture
async def memq(stack: Stack) -> AsyncIterator[MemoryClient]:
    async with await MemoryClient.connect(stack.url, app=APP) as client:
        yield client


@pytest.fixture
def user() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"  # the stack is shared by the module's tests


async def in_stream(url: str, seq: int) -> bool:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().get_msg(EVENTS_STREAM, seq)
        return True
    except NotFoundError:
        return False
    finally:
        await nc.close()


async def history_texts(memq: MemoryClient, user: str, session: str) -> list[str]:
    view = await memq.history(user, session, strategy={"kind": "all"}, consistency="any")
    return [e.event["message"]["parts"][0]["text"] for e in view.events]


async def found(memq: MemoryClient, user: str, word: str) -> list[tuple[str, int]]:
    """(session, seq) of the hits for ``word``, once everything written is indexed."""
    hits = await memq.search(user, word, mode="keyword", min_seq=memq.last_seq)
    return [(h.session_id, h.metadata["seq"]) for h in hits.results]


async def three_turns(memq: MemoryClient, user: str, session: str) -> list[int]:
    return [
        await memq.append_text(user, session, "user", "pelican sighting at the harbour"),
        await memq.append_text(user, session, "assistant", "secret code is zebra42"),
        await memq.append_text(user, session, "user", "pelican flew away"),
    ]


async def test_a_forgotten_event_is_gone_from_history_context_search_and_stream(stack, memq, user):
    seqs = await three_turns(memq, user, "s")
    # the next turn's doc matches too: the event is its context (indexing.context_turns)
    assert sorted(await found(memq, user, "zebra42")) == [("s", seqs[1]), ("s", seqs[2])]
    # read before the forget: the query worker now holds a window with the event
    before = await memq.context(user, "s", strategy={"kind": "all"}, consistency="any")
    assert any("zebra42" in str(m) for m in before.messages)
    assert await history_texts(memq, user, "s") == [
        "pelican sighting at the harbour",
        "secret code is zebra42",
        "pelican flew away",
    ]

    forget_seq = await memq.forget_event(user, "s", seqs[1])
    assert forget_seq > seqs[2]

    assert await history_texts(memq, user, "s") == ["pelican sighting at the harbour", "pelican flew away"]
    after = await memq.context(user, "s", strategy={"kind": "all"}, consistency="any")
    assert not any("zebra42" in str(m) for m in after.messages)
    assert [e.seq for e in (await memq.get_session(user, "s", events=True, consistency="any")).events] == [
        seqs[0],
        seqs[2],
    ]
    assert await found(memq, user, "zebra42") == []  # nor the next turn's context
    assert sorted(await found(memq, user, "pelican")) == [("s", seqs[0]), ("s", seqs[2])]
    assert sorted(await found(memq, user, "harbour")) == [("s", seqs[0]), ("s", seqs[2])]  # its context now
    # the stream: a replay (a rebuild of SQL or of the index) cannot bring it back
    await wait_for(lambda: _gone(stack.url, seqs[1]), 30, "the stream message deleted")
    assert await in_stream(stack.url, seqs[0]) and await in_stream(stack.url, seqs[2])
    assert await in_stream(stack.url, forget_seq)  # the forget itself stays: a replay repeats it


async def _gone(url: str, seq: int) -> bool:
    return not await in_stream(url, seq)


async def test_an_index_rebuild_from_the_stream_or_sql_does_not_bring_it_back(stack, memq, user):
    seqs = await three_turns(memq, user, "s")
    await memq.forget_event(user, "s", seqs[1])
    assert await found(memq, user, "zebra42") == []
    backend = stack.indexing.live.backend

    async def mine() -> set[tuple]:
        return {(d.seq, d.text, d.search_text) async for d in backend.export(app=APP, user=user)}

    live = await mine()
    assert {seq for seq, *_ in live} == {seqs[0], seqs[2]}
    engine = create_engine(stack.settings.database_url())
    embedder = await open_embedder(stack.settings.indexing)
    try:
        indexer = make_indexer(stack.settings, backend, embedder, stack.indexing.live.js, engine=engine)
        for source in ("stream", "sql"):
            await rebuild(stack.settings, stack.indexing.nc, indexer, source=source, engine=engine)
            assert await mine() == live, source  # the next turn's context too
            assert await found(memq, user, "zebra42") == []
    finally:
        await engine.dispose()


async def test_the_session_moves_on_so_expect_seq_after_a_forget_works(memq, user):
    seqs = await three_turns(memq, user, "s")
    forget_seq = await memq.forget_event(user, "s", seqs[2])
    view = await memq.get_session(user, "s", consistency="any")
    assert view.last_seq == forget_seq  # what a caller reads its next expect_seq from
    await memq.append_text(user, "s", "user", "next", expect_seq=view.last_seq)


async def test_a_repeated_forget_is_a_no_op(stack, memq, user):
    seqs = await three_turns(memq, user, "s")
    await memq.forget_event(user, "s", seqs[0])
    with pytest.raises(NotFound, match="no event at seq"):  # the client's check: forgotten already
        await memq.forget_event(user, "s", seqs[0])
    await memq.forget_event(user, "s", seqs[0], missing_ok=True)  # published anyway: the workers skip it
    assert await history_texts(memq, user, "s") == ["secret code is zebra42", "pelican flew away"]
    assert await found(memq, user, "pelican") == [("s", seqs[2])]
    assert await in_stream(stack.url, seqs[1]) and await in_stream(stack.url, seqs[2])


async def test_a_seq_of_another_session_or_user_is_not_forgotten(stack, memq, user):
    theirs = await three_turns(memq, f"{user}-other", "s")
    mine = await three_turns(memq, user, "mine")
    for session in ("s", "mine"):
        with pytest.raises(NotFound):
            await memq.forget_event(user, session, theirs[1])  # another user's event
    with pytest.raises(NotFound):
        await memq.forget_event(user, "nosuch", mine[1])  # a session that does not exist
    # published without the check: the subject names the scope, and the workers keep to it
    await memq.forget_event(user, "mine", theirs[1], missing_ok=True)
    await memq.forget_event(user, "other", mine[1], missing_ok=True)
    assert await history_texts(memq, f"{user}-other", "s") == [
        "pelican sighting at the harbour",
        "secret code is zebra42",
        "pelican flew away",
    ]
    assert len(await history_texts(memq, user, "mine")) == 3
    assert sorted(await found(memq, f"{user}-other", "zebra42")) == [("s", theirs[1]), ("s", theirs[2])]
    assert await in_stream(stack.url, theirs[1]) and await in_stream(stack.url, mine[1])
    # a forget does not start the session it names
    assert [s.session async for s in memq.iter_sessions(user, consistency="any")] == ["mine"]


async def test_a_seq_of_a_message_that_is_not_an_event_stays(stack, memq, user):
    created = (await memq.create_session(user, "s")).seq
    state = await memq.set_state(user, {"k": 1}, session="s")
    with pytest.raises(NotFound):
        await memq.forget_event(user, "s", created)
    for seq in (created, state):
        await memq.forget_event(user, "s", seq, missing_ok=True)
    await memq.get_session(user, "s", consistency="any")
    assert await in_stream(stack.url, created) and await in_stream(stack.url, state)
    assert (await memq.get_state(user, session="s", consistency="any"))["k"] == 1


@pytest.mark.parametrize("seq", [0, -3, True, 1.5, "7"])
async def test_a_bad_seq_is_refused_before_anything_is_published(memq, user, seq):
    before = memq.last_seq
    with pytest.raises(InvalidMessage, match="seq must be a positive integer"):
        await memq.forget_event(user, "s", seq)
    assert memq.last_seq == before


async def test_a_worker_dying_after_its_commit_still_forgets_once(stack, memq, user, monkeypatch):
    """The persistence worker commits the forget to SQL, then fails before
    the stream delete and the ack (as a crash there would): the forget is
    redelivered, and the second pass deletes the stream message."""
    seqs = await three_turns(memq, user, "s")
    await memq.get_session(user, "s", consistency="any")  # committed, before the failure is armed
    worker = stack.persistence
    real = PersistenceWorker._delete_forgotten
    calls: list[int] = []

    async def dies_once(self, result):
        calls.append(len(calls))
        if len(calls) == 1 and result.plan.forgets:
            raise RuntimeError("killed between the commit and the stream delete")
        await real(self, result)

    monkeypatch.setattr(PersistenceWorker, "_delete_forgotten", dies_once)
    await memq.forget_event(user, "s", seqs[1])
    await wait_for(lambda: _gone(stack.url, seqs[1]), 60, "the stream message deleted on redelivery")
    assert calls[:1] == [0] and len(calls) >= 2
    assert worker.committed >= 1
    assert await history_texts(memq, user, "s") == ["pelican sighting at the harbour", "pelican flew away"]
    assert await found(memq, user, "zebra42") == []
    assert await in_stream(stack.url, seqs[0]) and await in_stream(stack.url, seqs[2])
