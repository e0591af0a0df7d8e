"""PostgreSQL's whole-batch writes (workers/persistence/pg_bulk.py) keep the
row-by-row semantics: the first of two rows with one key stays, a value too
long for its column fails instead of being cut, and a session's touch keeps
its first created_at and the highest last_seq and updated_at. A batch that
guessed its session tombstones before its user locks commits again when a
delete committed in between."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from memq.contracts.ids import scope_key
from memq.contracts.schemas import Event, EventAppended, Message, SessionDeleted, TextPart
from memq.workers.memory.commit_plan import Incoming
from memq.workers.persistence import pg_bulk
from memq.workers.persistence.store import SqlStore
from memq.workers.sql.engine import create_engine, migrate
from memq.workers.sql.models import EVENTS, SESSIONS


@pytest.fixture
async def engine(pg_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(pg_url)
    await migrate(engine)
    yield engine
    await engine.dispose()


def appended(text: str, *, event_id: str | None = None, timestamp: float = 1000.0) -> EventAppended:
    event = Event(message=Message(role="user", parts=[TextPart(text=text)]), timestamp=timestamp)
    if event_id is not None:
        event = event.model_copy(update={"id": event_id})
    return EventAppended(app="a", user="u", session="s", event=event)


async def stored(engine: AsyncEngine) -> list[tuple[str, int, str]]:
    q = sa.select(EVENTS.c.event_id, EVENTS.c.seq, EVENTS.c.data).order_by(EVENTS.c.seq)
    async with engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(q)).all()]


async def test_a_repeated_event_id_in_one_batch_keeps_the_first(engine):
    items = [
        Incoming(5, appended("first", event_id="e1")),
        Incoming(6, appended("other")),
        Incoming(9, appended("again", event_id="e1")),  # republished after the dedupe window
    ]
    await SqlStore(engine).commit(items)
    await SqlStore(engine).commit(items)  # a redelivery changes nothing
    rows = await stored(engine)
    assert [(event_id, seq) for event_id, seq, _ in rows] == [("e1", 5), (items[1].message.event.id, 6)]
    assert '"first"' in rows[0][2]


async def test_a_value_too_long_for_its_column_fails_instead_of_being_cut(engine):
    row = {
        "session_key": "k" * 64,
        "event_id": "x" * 300,  # memq_events.event_id is varchar(256)
        "seq": 1,
        "invocation_id": "",
        "author": "",
        "branch": "",
        "role": None,
        "timestamp": 0.0,
        "tokens": 0,
        "data": "{}",
    }
    with pytest.raises(sa.exc.DBAPIError, match="too long"):
        async with engine.begin() as conn:
            await pg_bulk.insert_ignore(conn, EVENTS, [row])
    assert await stored(engine) == []


async def test_touch_keeps_the_first_created_at_and_the_highest_seq_and_time(engine):
    store = SqlStore(engine)
    await store.commit([Incoming(3, appended("a", timestamp=100.0))])
    await store.commit([Incoming(7, appended("b", timestamp=300.0))])
    await store.commit([Incoming(5, appended("c", timestamp=200.0))])  # an older batch, committed late
    key = scope_key("a", "u", "s")
    q = sa.select(SESSIONS.c.created_at, SESSIONS.c.last_seq, SESSIONS.c.updated_at).where(SESSIONS.c.key == key)
    async with engine.connect() as conn:
        assert tuple((await conn.execute(q)).one()) == (100.0, 7, 300.0)


class CountingStore(SqlStore):
    """Records, per transaction, whether it guessed the session tombstones
    (the full commit: the one-statement path for appends is turned off)."""

    def __init__(self, engine: AsyncEngine):
        super().__init__(engine)
        self.guesses: list[bool] = []

    async def _append_only(self, items, scopes, *, tokens=None):
        return None

    async def _commit(self, items, scopes, deleting, *, guess, tokens=None):
        self.guesses.append(guess)
        return await super()._commit(items, scopes, deleting, guess=guess, tokens=tokens)


@pytest.mark.parametrize("one_statement", [False, True])
async def test_a_commit_waiting_on_a_delete_keeps_only_what_is_newer(engine, one_statement):
    """The full commit guesses the tombstones while it waits for the user
    lock, misses the delete and commits again after the locks. The
    one-statement commit of appends takes no user lock: the session row it
    locks is what the delete updates, so it waits for the delete and then
    sees its tombstone."""
    await SqlStore(engine).commit([Incoming(1, appended("first"))])
    # A session delete holds its user's row FOR UPDATE until it commits.
    async with engine.begin() as conn:
        await conn.execute(sa.text("SELECT 1 FROM memq_users FOR UPDATE"))
        await conn.execute(sa.update(SESSIONS).values(deleted_seq=10))
        await conn.execute(sa.delete(EVENTS).where(EVENTS.c.seq < 10))
        store = CountingStore(engine)
        if one_statement:
            store._append_only = SqlStore._append_only.__get__(store)  # type: ignore[method-assign]
        late = asyncio.create_task(store.commit([Incoming(5, appended("older")), Incoming(11, appended("newer"))]))
        await asyncio.sleep(0.5)
        assert not late.done()
    await asyncio.wait_for(late, 30)
    assert store.guesses == ([] if one_statement else [True, False])
    assert [seq for _, seq, _ in await stored(engine)] == [11]  # 5 is older than the delete
    result = late.result()
    assert result.plan.dropped == [5] and result.plan.touched[scope_key("a", "u", "s")].last_seq == 11


async def test_an_append_only_batch_to_a_deleted_session_leaves_it_deleted(engine):
    store = SqlStore(engine)
    await store.commit([Incoming(1, appended("first"))])
    await store.commit([Incoming(9, SessionDeleted(app="a", user="u", session="s"))])
    result = await store.commit([Incoming(4, appended("late"))])  # redelivered from before the delete
    assert result.plan.dropped == [4] and result.plan.touched == {}
    assert await stored(engine) == []
    q = sa.select(SESSIONS.c.last_seq, SESSIONS.c.deleted_seq).where(SESSIONS.c.key == scope_key("a", "u", "s"))
    async with engine.connect() as conn:
        last_seq, deleted_seq = (await conn.execute(q)).one()
    assert last_seq <= deleted_seq  # still deleted


async def test_a_batch_that_deletes_reads_the_tombstones_after_the_locks(engine):
    store = CountingStore(engine)
    await store.commit([Incoming(1, appended("first"))])
    await store.commit([Incoming(2, SessionDeleted(app="a", user="u", session="s"))])
    assert store.guesses == [True, False]
