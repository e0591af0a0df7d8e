"""Which commits wait for which (issue 13, replicas that add throughput).

Commits of different sessions of one user run side by side; a delete of a
session or user still waits for the commits in flight, and they for it, so any
commit order equals stream order. Real SQL store on the servers that lock rows;
SQLite has one writer at a time by design.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from memq.contracts.schemas import Event, EventAppended, SessionDeleted, UserDeleted
from memq.workers.memory.commit_plan import Incoming, Scopes, Tombstones
from memq.workers.persistence.store import SqlStore
from memq.workers.sql import reads
from memq.workers.sql.engine import create_engine, migrate

APP = "app"
DATABASES = ["pg_url", "mariadb_url"]
PROCEEDS_WITHIN_S = 2.0
WAITS_AT_LEAST_S = 0.5


class PausedStore(SqlStore):
    """Stops a commit right after it has taken its locks, its transaction open,
    until ``release`` is set."""

    def __init__(self, engine: AsyncEngine):
        super().__init__(engine)
        self.locked = asyncio.Event()
        self.release = asyncio.Event()

    async def _append_only(self, items, scopes, *, tokens=None):
        return None  # the full commit, the one with a lock step to pause after

    async def _lock_scopes(self, conn: AsyncConnection, scopes: Scopes, *args) -> Tombstones:
        tombstones = await super()._lock_scopes(conn, scopes, *args)
        self.locked.set()
        await self.release.wait()
        return tombstones


def appended(seq: int, user: str, session: str) -> Incoming:
    return Incoming(seq, EventAppended(app=APP, user=user, session=session, event=Event(author="user")))


@asynccontextmanager
async def store_on(request: pytest.FixtureRequest, db: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(request.getfixturevalue(db))
    try:
        await migrate(engine)
        # The user and its sessions exist, as they do after a first commit.
        await SqlStore(engine).commit([appended(1, "u", "s1"), appended(2, "u", "s2")])
        yield engine
    finally:
        await engine.dispose()


@asynccontextmanager
async def paused(engine: AsyncEngine, items: list[Incoming]) -> AsyncIterator[asyncio.Task]:
    """A commit of ``items`` held open after its lock step; finished on exit."""
    store = PausedStore(engine)
    task = asyncio.create_task(store.commit(items))
    await asyncio.wait_for(store.locked.wait(), PROCEEDS_WITHIN_S)
    try:
        yield task
    finally:
        store.release.set()
        await asyncio.wait_for(task, 30)


async def seqs(engine: AsyncEngine, session: str) -> list[int]:
    return [e.seq for e in await reads.events(engine, APP, "u", session)]


@pytest.mark.parametrize("db", DATABASES)
async def test_a_commit_of_another_session_of_the_user_proceeds_while_one_is_open(request, db):
    async with store_on(request, db) as engine, paused(engine, [appended(10, "u", "s1")]):
        # The old store locked the user's row FOR UPDATE until commit: this waited.
        await asyncio.wait_for(SqlStore(engine).commit([appended(11, "u", "s2")]), PROCEEDS_WITHIN_S)
        assert await seqs(engine, "s2") == [2, 11]
    assert await seqs(engine, "s1") == [1, 10]


@pytest.mark.parametrize("db", DATABASES)
async def test_a_user_delete_waits_for_the_open_commit_then_removes_its_rows(request, db):
    async with store_on(request, db) as engine:
        async with paused(engine, [appended(10, "u", "s1")]) as open_commit:
            delete = asyncio.create_task(SqlStore(engine).commit([Incoming(12, UserDeleted(app=APP, user="u"))]))
            await asyncio.sleep(WAITS_AT_LEAST_S)
            assert not delete.done(), "the delete did not wait for the commit in flight"
        await open_commit
        await asyncio.wait_for(delete, 30)
        # A write from before the delete that arrives after it is dropped.
        await SqlStore(engine).commit([appended(11, "u", "s2")])
        assert await seqs(engine, "s1") == await seqs(engine, "s2") == []


class FullStore(SqlStore):
    async def _append_only(self, items, scopes, *, tokens=None):
        return None


@pytest.mark.parametrize("db", DATABASES)
@pytest.mark.parametrize("one_statement", [False, True])
async def test_a_commit_waits_for_an_open_session_delete_then_drops_older_writes(request, db, one_statement):
    """The full commit waits for the delete's user lock. PostgreSQL's
    one-statement commit of appends takes no user lock: it may go first, and
    the delete then removes what it wrote below the tombstone (it waits for
    the session row the other locks); the end is the same."""
    async with store_on(request, db) as engine:
        deleted = Incoming(12, SessionDeleted(app=APP, user="u", session="s1"))
        store = SqlStore(engine) if one_statement else FullStore(engine)
        async with paused(engine, [deleted]):
            late = asyncio.create_task(store.commit([appended(11, "u", "s1"), appended(13, "u", "s2")]))
            await asyncio.sleep(WAITS_AT_LEAST_S)
            if not one_statement:
                assert not late.done(), "the commit read the session's tombstone before the delete committed"
        await asyncio.wait_for(late, 30)
        assert await seqs(engine, "s1") == []  # seq 11 is older than the delete at 12
        assert await seqs(engine, "s2") == [2, 13]
