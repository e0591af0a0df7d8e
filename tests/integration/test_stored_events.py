"""The persistence worker's check for reused event ids matches (session, id)
pairs in SQL (a row-value ``IN``), on every database: it returns the pairs
asked for and never an event of one of the batch's sessions that has another
batch event's id. (That it no longer reads every event of the batch's
sessions is measured, not tested: tests/bench/agent_loop.py, PostgreSQL's
CPU per turn.)"""

from __future__ import annotations

import pytest

from memq.contracts.ids import scope_key
from memq.contracts.schemas import Event, EventAppended
from memq.workers.memory.commit_plan import Incoming
from memq.workers.persistence.store import SqlStore
from memq.workers.sql.engine import create_engine, migrate

APP = "app"


def appended(seq: int, session: str, event_id: str) -> Incoming:
    return Incoming(seq, EventAppended(app=APP, user="u", session=session, event=Event(id=event_id, author="user")))


@pytest.mark.parametrize("db", ["pg_url", "mariadb_url", "sqlite_url"])
async def test_stored_events_are_the_pairs_asked_for(request, db):
    engine = create_engine(request.getfixturevalue(db))
    try:
        await migrate(engine)
        store = SqlStore(engine)
        # s1 holds a and b, s2 holds c, and 450 more in s3 (more than one chunk of 400).
        batch = [appended(1, "s1", "a"), appended(2, "s1", "b"), appended(3, "s2", "c")]
        batch += [appended(10 + i, "s3", f"e{i}") for i in range(450)]
        await store.commit(batch)
        s1, s2, s3 = (scope_key(APP, "u", s) for s in ("s1", "s2", "s3"))
        asked = [(s1, "a"), (s1, "c"), (s2, "c"), (s2, "a"), (s2, "zz")] + [(s3, f"e{i}") for i in range(0, 450, 2)]
        found = await store.stored_events(asked)
        expected = {(s1, "a"): 1, (s2, "c"): 3} | {(s3, f"e{i}"): 10 + i for i in range(0, 450, 2)}
        assert {key: seq for key, (seq, _) in found.items()} == expected
        assert all(f'"id":"{key[1]}"' in data for key, (_, data) in found.items())
    finally:
        await engine.dispose()
