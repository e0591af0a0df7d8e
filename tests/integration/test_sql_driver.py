"""The hot reads on asyncpg's prepared statements (workers/sql/driver.py)
answer what SQLAlchemy answers, really bypass it on PostgreSQL, and fail as
a SQLAlchemy read fails when the connection dies (so the caller's retry on a
fresh connection works)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine

from memq.contracts.ids import scope_key
from memq.contracts.schemas import CheckpointSaved, Event, EventAppended, Message, TextPart
from memq.workers.memory.commit_plan import Incoming
from memq.workers.persistence.store import SqlStore
from memq.workers.sql import reads
from memq.workers.sql.driver import fetch_all
from memq.workers.sql.engine import create_engine, is_disconnect, migrate, reader

KEY = scope_key("a", "u", "s")


def appended(seq: int) -> Incoming:
    event = Event(author="user", message=Message(role="user", parts=[TextPart(text=f"turn {seq}")]))
    return Incoming(seq, EventAppended(app="a", user="u", session="s", event=event))


@asynccontextmanager
async def seeded(url: str) -> AsyncIterator[AsyncEngine]:
    """A session of 32 events and a checkpoint (seq 31) covering 1-20."""
    engine = create_engine(url)
    try:
        await migrate(engine)
        store = SqlStore(engine)
        await store.commit([appended(seq) for seq in range(1, 31)])
        summary = CheckpointSaved(app="a", user="u", session="s", up_to_seq=20, summary="so far")
        await store.commit([Incoming(31, summary), appended(32)])
        yield engine
    finally:
        await engine.dispose()


def sent_by_sqlalchemy(engine) -> list[str]:
    """The statements SQLAlchemy sends to the database from now on."""
    statements: list[str] = []
    event.listen(engine.sync_engine, "before_cursor_execute", lambda c, cursor, sql, *rest: statements.append(sql))
    return statements


# Every statement fetch_all runs, with parameters that find rows.
CASES = [
    (reads._session_row(), {"key": KEY}),
    (reads._session_and_checkpoint(), {"key": KEY}),
    (reads._session_checkpoint_and_newer(), {"key": KEY, "after": 25, "limit": 4}),
    (reads._session_checkpoint_and_newer(), {"key": KEY, "after": 99, "limit": 4}),  # no newer event
    (reads._newest_events(False), {"key": KEY, "after": 0, "limit": 5}),
    (reads._newest_events(True), {"key": KEY, "after": 3, "before": 9, "limit": 50}),
]


async def test_on_postgresql_the_rows_are_sqlalchemys_rows(pg_url):
    async with seeded(pg_url) as engine:
        async with reader(engine).connect() as conn:
            for statement, params in CASES:
                expected = [tuple(r) for r in (await conn.execute(statement, params)).all()]
                assert expected, statement
                assert [tuple(r) for r in await fetch_all(conn, statement, params)] == expected


@pytest.mark.parametrize("database", ["postgresql", "sqlite"])
async def test_the_reads_take_the_rows_by_position(database, request):
    async with seeded(request.getfixturevalue("pg_url" if database == "postgresql" else "sqlite_url")) as engine:
        async with reader(engine).connect() as conn:
            # the session row, the checkpoint and the events after it
            row, checkpoint, newer, _ = await reads.session_checkpoint_and_newer(conn, KEY, after_seq=29, limit=10)
            assert (row.last_seq, row.deleted_seq) == (32, 0)
            assert (checkpoint.seq, checkpoint.up_to_seq, checkpoint.summary) == (31, 20, "so far")
            assert [e.seq for e in newer] == [32, 30] and newer[0].data["message"]["parts"][0]["text"] == "turn 32"


async def test_on_postgresql_the_read_does_not_go_through_sqlalchemy(pg_url):
    async with seeded(pg_url) as engine:
        through_sqlalchemy = sent_by_sqlalchemy(engine)
        async with reader(engine).connect() as conn:
            rows = await fetch_all(conn, *CASES[2])
            event_seq = reads._CP + 4  # after the session's and the checkpoint's columns
            assert [r[event_seq] for r in rows] == [32, 30, 29, 28]  # 31 is the checkpoint
            assert through_sqlalchemy == []
            await conn.execute(*CASES[2])  # the listener does hear SQLAlchemy's
            assert len(through_sqlalchemy) == 1


async def test_a_commit_of_appends_runs_on_the_driver_too(pg_url):
    async with seeded(pg_url) as engine:
        through_sqlalchemy = sent_by_sqlalchemy(engine)
        again = appended(41)
        await SqlStore(engine).commit([appended(40), again, again])  # a redelivery in the batch
        assert through_sqlalchemy == []  # the append-only commit: one statement, on asyncpg
        async with reader(engine).connect() as conn:
            assert [e.seq for e in await reads.newest_events(conn, KEY, after_seq=32, limit=9)] == [41, 40]
            assert (await reads.session_row(conn, KEY)).last_seq == 41


async def test_a_dead_connection_fails_as_sqlalchemy_says_and_the_retry_reads(pg_url):
    async with seeded(pg_url) as engine:
        async with reader(engine).connect() as conn:
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            async with engine.connect() as other:
                await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(sa_exc.DBAPIError) as failed:
                await fetch_all(conn, *CASES[0])
            assert is_disconnect(failed.value)
        async with reader(engine).connect() as conn:  # what the query worker's retry does
            assert len(await fetch_all(conn, *CASES[0])) == 1


@pytest.mark.parametrize("database", ["postgresql", "sqlite"])
async def test_the_ids_a_read_asks_for_come_with_it(database, request):
    """The tail read's id check (query.read_tail): on PostgreSQL as one
    array parameter, so it too runs on asyncpg; elsewhere an IN list."""
    async with seeded(request.getfixturevalue("pg_url" if database == "postgresql" else "sqlite_url")) as engine:
        async with reader(engine).connect() as conn:
            ids = {e.event_id: e.seq for e in await reads.newest_events(conn, KEY, after_seq=0, limit=3)}
            asked = [*ids, "never-stored"]
            through_sqlalchemy = sent_by_sqlalchemy(engine)
            row, _, newer, stored = await reads.session_checkpoint_and_newer(
                conn, KEY, after_seq=29, limit=10, ids=asked
            )
            assert row.last_seq == 32 and [e.seq for e in newer] == [32, 30]  # each event once, whatever was found
            assert stored == ids and sorted(ids.values()) == [29, 30, 32]
            assert await reads.stored_event_ids(conn, KEY, asked) == ids
            assert len(through_sqlalchemy) == (0 if database == "postgresql" else 2)
