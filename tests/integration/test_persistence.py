"""The persistence worker against real NATS and real databases (issue: the spine)."""

from __future__ import annotations

import asyncio

import nats
import orjson
import pytest
import sqlalchemy as sa
from helpers import event_counts, make_settings, running_worker, wait_committed, wait_for
from nats.js.api import StreamInfo
from nats.js.errors import NotFoundError
from sqlalchemy import text as sa_text

from memq.contracts import codec
from memq.contracts.client import MemoryClient
from memq.contracts.ids import scope_key
from memq.contracts.schemas import (
    Actions,
    Event,
    EventAppended,
    EventForgotten,
    Message,
    SessionCreated,
    StateSet,
    TextPart,
)
from memq.contracts.subjects import events_subject
from memq.workers.memory.commit_plan import Incoming
from memq.workers.memory.state import apply_in_order
from memq.workers.persistence.store import SqlStore
from memq.workers.sql import reads
from memq.workers.sql.engine import create_engine, migrate
from memq.workers.sql.models import EVENTS, SESSIONS

APP = "agent-x"


def text_event(text: str, **delta) -> Event:
    return Event(
        author="user",
        message=Message(role="user", parts=[TextPart(text=text)]),
        actions=Actions(state_delta=delta),
    )


async def subjects_in_stream(js, subject: str) -> dict[str, int]:
    info: StreamInfo = await js.stream_info("MEMQ_EVENTS", subjects_filter=subject)
    return info.state.subjects or {}


@pytest.mark.parametrize("db", ["sqlite_url", "pg_url", "mariadb_url"])
async def test_round_trip_10000_events_in_publish_order(request, db, nats_url, tmp_path):
    url = request.getfixturevalue(db)
    settings = make_settings(nats_url, url, tmp_path)
    published: dict[str, list[str]] = {}
    async with running_worker(settings) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:

            async def one_session(i: int) -> None:
                session = f"session-{i:03d}"
                events = [text_event(f"turn {t} of {session}", turn=t) for t in range(100)]
                published[session] = [e.id for e in events]
                await client.append_many("user-1", session, events)

            await asyncio.gather(*(one_session(i) for i in range(100)))
        await wait_for(lambda: _committed(worker.live.engine, 10_000), timeout=240, what="10,000 events in SQL")
        for session, ids in published.items():
            stored = await reads.events(worker.live.engine, APP, "user-1", session)
            assert [e.event_id for e in stored] == ids
            assert (await reads.state(worker.live.engine, APP, "user-1", session))["turn"] == 99


# Batches of one session's stream (by seq), in the order replicas commit them.
COMMIT_ORDERS = [
    [[2], [3], [4], [5], [6], [7]],
    [[7], [6], [5], [4], [3], [2], [4]],  # backwards, and a late redelivery
    [[2, 3, 4, 5, 6, 7]],
    [[6, 7], [2, 3], [4, 5]],
    [[2], [6], [4, 5], [3, 7]],
]


@pytest.mark.parametrize("db", ["sqlite_url", "pg_url", "mariadb_url"])
async def test_updated_at_is_the_time_of_the_newest_event_whatever_the_commit_order(request, db):
    """ADK's last_update_time: the timestamp of the session's last event in
    stream order, even an older one than those before it; state sets (as
    checkpoints and artifacts) leave it alone once the session has an event
    or its creation, and set it (the latest) before."""
    engine = create_engine(request.getfixturevalue(db))
    await migrate(engine)

    def ev(timestamp: float) -> Event:
        return text_event("hi").model_copy(update={"timestamp": timestamp})

    async def session_row(session: str) -> tuple:
        q = sa.select(SESSIONS.c.updated_at, SESSIONS.c.updated_seq, SESSIONS.c.last_seq)
        async with engine.connect() as conn:
            return tuple((await conn.execute(q.where(SESSIONS.c.key == scope_key(APP, "u", session)))).one())

    store = SqlStore(engine)
    try:
        for n, order in enumerate(COMMIT_ORDERS):
            ids = dict(app=APP, user="u", session=f"s{n}")
            stream = {
                2: SessionCreated(**ids, timestamp=500.0),
                3: StateSet(**ids, delta={"k": 1}, timestamp=900.0),
                4: EventAppended(**ids, event=ev(300.0)),
                5: EventAppended(**ids, event=ev(800.0)),
                6: EventAppended(**ids, event=ev(100.0)),  # the newest event has the oldest time
                7: StateSet(**ids, delta={"k": 2}, timestamp=950.0),
            }
            for batch in order:
                await store.commit([Incoming(seq, stream[seq]) for seq in batch])
            assert await session_row(f"s{n}") == (100.0, 6, 7), order
        ids = dict(app=APP, user="u", session="only-state")
        await store.commit([Incoming(9, StateSet(**ids, delta={"k": 1}, timestamp=40.0))])
        await store.commit([Incoming(8, StateSet(**ids, delta={"k": 0}, timestamp=50.0))])
        assert await session_row("only-state") == (50.0, 0, 9)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("db", ["sqlite_url", "pg_url", "mariadb_url"])
async def test_a_forget_deletes_one_event_of_its_session_in_any_commit_order(request, db):
    """The row goes (in the forget's batch or an earlier one), the session's
    forgot_seq and last_seq move, another session's event at the forgotten
    seq stays, and a forget never makes a session visible."""
    engine = create_engine(request.getfixturevalue(db))
    await migrate(engine)
    store = SqlStore(engine)

    async def seqs(session: str) -> list[int]:
        q = sa.select(EVENTS.c.seq).where(EVENTS.c.session_key == scope_key(APP, "u", session))
        async with engine.connect() as conn:
            return sorted((await conn.execute(q)).scalars())

    async def session_row(session: str) -> tuple | None:
        q = sa.select(SESSIONS.c.last_seq, SESSIONS.c.forgot_seq, SESSIONS.c.deleted_seq)
        async with engine.connect() as conn:
            row = (await conn.execute(q.where(SESSIONS.c.key == scope_key(APP, "u", session)))).first()
        return tuple(row) if row else None

    try:
        for n, batches in enumerate(([[1, 2, 3, 4]], [[1, 2, 3], [4]], [[1, 2], [3], [4]])):
            ids = dict(app=APP, user="u", session=f"s{n}")
            stream = {
                1: EventAppended(**ids, event=text_event("a")),
                2: EventAppended(**ids, event=text_event("secret")),
                3: EventAppended(**ids, event=text_event("b")),
                4: EventForgotten(**ids, seq=2),
            }
            for batch in batches:
                await store.commit([Incoming(seq, stream[seq]) for seq in batch])
            await store.commit([Incoming(4, stream[4])])  # redelivered: nothing more
            assert await seqs(f"s{n}") == [1, 3], batches
            assert await session_row(f"s{n}") == (4, 4, 0), batches
        other = dict(app=APP, user="u", session="other")
        await store.commit([Incoming(10, EventAppended(**other, event=text_event("theirs")))])
        await store.commit([Incoming(11, EventForgotten(app=APP, user="u", session="s0", seq=10))])
        assert await seqs("other") == [10]
        await store.commit([Incoming(12, EventForgotten(app=APP, user="u", session="ghost", seq=10))])
        assert await session_row("ghost") in (None, (0, 12, 0))  # a lock row at most: not visible
        await store.commit([Incoming(13, EventForgotten(app=APP, user="u", session="other", seq=14))])
        assert await seqs("other") == [10]  # a seq after the forget's own names nothing yet
    finally:
        await engine.dispose()


async def _committed(engine, n: int) -> bool:
    rows, distinct = await event_counts(engine)
    assert rows == distinct, "an event is stored twice"
    return rows >= n


async def test_duplicates_are_stored_once(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    event = text_event("hello")
    async with running_worker(settings) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            first = await client.append("u", "s", event)
            again = await client.append("u", "s", event)  # inside the dedupe window
            assert again == first
        # Past the dedupe window: the same event under another Nats-Msg-Id.
        nc = await nats.connect(nats_url)
        msg = EventAppended(app=APP, user="u", session="s", event=event)
        ack = await nc.jetstream().publish(codec.subject_for(msg), codec.encode(msg), headers={"Nats-Msg-Id": "other"})
        await nc.close()
        assert ack.seq != first
        marker = text_event("after")
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("u", "s", marker)
        await wait_for(lambda: _has(worker.live.engine, "s", marker.id), what="marker event")
        # Redelivery of a batch already committed (as after a crash before the ack).
        await worker.live.store.commit([Incoming(first, msg), Incoming(ack.seq, msg)])
        stored = await reads.events(worker.live.engine, APP, "u", "s")
        assert [e.event_id for e in stored] == [event.id, marker.id]


async def _has(engine, session: str, event_id: str) -> bool:
    return event_id in [e.event_id for e in await reads.events(engine, APP, "u", session)]


async def test_bad_input_is_dead_lettered_with_reason_and_worker_goes_on(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    settings.streams.max_message_bytes = 64 * 1024
    good = EventAppended(app=APP, user="u", session="s", event=text_event("fine"))
    huge = EventAppended(app=APP, user="u", session="s", event=text_event("x" * 100_000))
    too_long_id = orjson.loads(codec.encode(good))
    too_long_id["user"] = "u" * 300
    mismatch = EventAppended(app=APP, user="someone-else", session="s", event=text_event("spoof"))
    cases = [
        (events_subject(APP, "u", "s"), b"{not json", "invalid_message"),
        (
            events_subject(APP, "u", "s"),
            orjson.dumps({**orjson.loads(codec.encode(good)), "v": 99}),
            "unsupported_version",
        ),
        (events_subject(APP, "u", "s"), codec.encode(huge), "oversize"),
        (events_subject(APP, "u", "s"), orjson.dumps(too_long_id), "invalid_id"),
        ("memq.v1.ev.agent-x.u.bad~ZZtoken", codec.encode(good), "invalid_id"),
        (events_subject(APP, "u", "s"), codec.encode(mismatch), "subject_mismatch"),
    ]
    async with running_worker(settings) as worker:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        seqs = [(await js.publish(subject, payload)).seq for subject, payload, _ in cases]
        await js.publish(codec.subject_for(good), codec.encode(good))
        await wait_for(lambda: _has(worker.live.engine, "s", good.event.id), what="the good event after bad ones")
        dlq = await js.stream_info("MEMQ_DLQ")
        assert dlq.state.messages == len(cases)
        by_seq = {}
        for seq in range(dlq.state.first_seq, dlq.state.last_seq + 1):
            m = await js.get_msg("MEMQ_DLQ", seq)
            by_seq[int(m.headers["Memq-Original-Seq"])] = m.headers
        for seq, (_, _, code) in zip(seqs, cases):
            assert by_seq[seq]["Memq-Error-Code"] == code
            assert by_seq[seq]["Memq-Error"]  # a reason a human can read
        await nc.close()


async def test_state_scopes_follow_adk(nats_url, pg_url, tmp_path):
    settings = make_settings(nats_url, pg_url, tmp_path)
    async with running_worker(settings) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.create_session("alice", "a1", state={"topic": "x", "user:lang": "fr", "app:model": "m1"})
            await client.create_session("alice", "a2")
            await client.create_session("bob", "b1", state={"temp:scratch": 1})
            await client.append("bob", "b1", text_event("hi", **{"app:model": "m2", "temp:t": 2}))
            last = await client.append("alice", "a2", text_event("done"))
        e = worker.live.engine
        await wait_committed(nats_url, last)
        assert await reads.state(e, APP, "alice", "a1") == {"topic": "x", "user:lang": "fr", "app:model": "m2"}
        assert await reads.state(e, APP, "alice", "a2") == {"user:lang": "fr", "app:model": "m2"}
        assert await reads.state(e, APP, "bob", "b1") == {"app:model": "m2"}  # temp: never stored


async def _has_seq(engine, user: str, session: str, seq: int) -> bool:
    return seq in [ev.seq for ev in await reads.events(engine, APP, user, session)]


async def test_final_state_equals_stream_order_with_3_replicas(nats_url, pg_url, tmp_path):
    settings = make_settings(nats_url, pg_url, tmp_path, batch_size=7)
    deltas = [{"k": i % 13, "user:n": i, "app:last": i, f"key{i % 5}": i} for i in range(600)]
    async with running_worker(settings) as w1, running_worker(settings) as w2, running_worker(settings) as w3:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append_many("u", "s", [text_event(str(i), **d) for i, d in enumerate(deltas)])
        await wait_for(lambda: _committed(w1.live.engine, len(deltas)), timeout=120, what="all events")
        assert sum(w.committed for w in (w1, w2, w3)) >= len(deltas)
        assert sum(w.committed > 0 for w in (w1, w2, w3)) >= 2, "the replicas did not share the work"
        assert await reads.state(w1.live.engine, APP, "u", "s") == apply_in_order(deltas)


async def test_delete_session_and_user_remove_rows_and_stream_subjects(nats_url, pg_url, tmp_path):
    settings = make_settings(nats_url, pg_url, tmp_path)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    async with running_worker(settings) as worker:
        e = worker.live.engine
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            for session in ("s1", "s2"):
                await client.create_session("carol", session, state={"k": 1, "user:u": 1, "app:a": 1})
                await client.append_many("carol", session, [text_event(f"{session} {i}") for i in range(5)])
            await client.save_artifact("carol", "s1", "notes.txt", b"some notes")
            await client.append_many("dave", "d1", [text_event("dave's") for _ in range(3)])
            last = await client.append("carol", "s2", text_event("last"))
            await wait_committed(nats_url, last)

            await wait_committed(nats_url, await client.delete_session("carol", "s1", missing_ok=True))
            assert not await reads.session_exists(e, APP, "carol", "s1")
            assert await reads.count_events(e, APP, "carol", "s1") == 0
            assert await reads.state(e, APP, "carol", "s1") == {"user:u": 1, "app:a": 1}
            assert await reads.session_exists(e, APP, "carol", "s2")
            left = await subjects_in_stream(js, events_subject(APP, "carol", "s1"))
            assert sum(left.values()) <= 1  # only the delete's own tombstone remains

            await wait_committed(nats_url, await client.delete_user("carol", missing_ok=True))
        assert not await reads.session_exists(e, APP, "carol", "s2")
        assert await reads.count_events(e, APP, "carol", "s2") == 0
        assert await reads.state(e, APP, "carol") == {"app:a": 1}  # app state is not the user's
        # Every session message of carol is purged, s1's delete tombstone too;
        # only the user delete itself stays, so a replay deletes again.
        assert await subjects_in_stream(js, events_subject(APP, "carol") + ".>") == {}
        assert sum((await subjects_in_stream(js, events_subject(APP, "carol"))).values()) == 1
        assert await reads.count_events(e, APP, "dave", "d1") == 3  # others untouched
    await nc.close()


async def test_recreated_session_after_delete_is_visible_again(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(settings) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("u", "s", text_event("old"))
            await client.delete_session("u", "s", missing_ok=True)
            seq = await client.append("u", "s", text_event("new"))
        await wait_for(lambda: _has_seq(worker.live.engine, "u", "s", seq), what="new event")
        stored = await reads.events(worker.live.engine, APP, "u", "s")
        assert [ev.data["message"]["parts"][0]["text"] for ev in stored] == ["new"]
        assert await reads.session_exists(worker.live.engine, APP, "u", "s")


def test_engine_for_inmemory_backend_is_shared(tmp_path):
    """The `inmemory` sessions backend: SQLite in memory, one connection that
    callers take in turn (shared by the workers of a process: test_sqlite_engine)."""
    settings = make_settings("nats://unused", "inmemory", tmp_path)
    assert settings.database_url() == "sqlite+aiosqlite:///:memory:"
    engine = create_engine(settings.database_url())
    assert engine.pool.__class__.__name__ == "AsyncAdaptedQueuePool" and engine.pool.size() == 1


async def test_artifacts_are_versioned_and_large_ones_deleted_with_their_session(nats_url, pg_url, tmp_path):
    import hashlib

    from sqlalchemy import select

    from memq.contracts.subjects import ARTIFACT_BUCKET
    from memq.workers.sql import models

    settings = make_settings(nats_url, pg_url, tmp_path)
    big = bytes(range(256)) * (64 * 1024 * 4)  # 64 MiB
    nc = await nats.connect(nats_url)
    async with running_worker(settings) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.save_artifact("u", "s", "notes.txt", b"v0", "text/plain")
            await client.save_artifact("u", "s", "notes.txt", b"v1", "text/plain")
            last = await client.save_artifact("u", "s", "big.bin", big)
            await wait_committed(nats_url, last, timeout=120)
            t = models.Artifact.__table__
            async with worker.live.engine.connect() as conn:
                rows = (await conn.execute(select(t).order_by(t.c.seq))).all()
            assert [(r.filename, r.inline) for r in rows[:2]] == [("notes.txt", b"v0"), ("notes.txt", b"v1")]
            assert rows[2].seq == last and rows[2].inline is None and rows[2].size == len(big)
            assert rows[2].sha256 == hashlib.sha256(big).hexdigest()
            store = await nc.jetstream().object_store(ARTIFACT_BUCKET)
            assert (await store.get_info(rows[2].object_name)).size == len(big)

            await wait_committed(nats_url, await client.delete_session("u", "s", missing_ok=True))
        async with worker.live.engine.connect() as conn:
            assert (await conn.execute(select(t))).all() == []
        with pytest.raises(NotFoundError):  # nats-py's way of saying "no objects"
            await store.list(ignore_deletes=True)
    await nc.close()


async def test_a_message_the_database_rejects_is_dead_lettered_not_retried_forever(nats_url, pg_url, tmp_path):
    # The contract refuses what PostgreSQL cannot store (NUL, >64-bit ints),
    # so a rejection here comes from the database itself: a constraint an
    # operator added, a schema drift. One message must not stall the others.
    settings = make_settings(nats_url, pg_url, tmp_path)
    async with running_worker(settings) as worker:
        async with worker.live.engine.begin() as conn:
            await conn.execute(
                sa_text("ALTER TABLE memq_events ADD CONSTRAINT no_rejects CHECK (author <> 'rejected')")
            )
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            bad = await client.append(
                "u", "s", Event(author="rejected", message=Message(role="user", parts=[TextPart(text="x")]))
            )
            good = await client.append("u", "s", text_event("stored"))
        await wait_for(lambda: _has_seq(worker.live.engine, "u", "s", good), what="the good event")
        nc = await nats.connect(nats_url)
        js = nc.jetstream()

        async def dead_lettered() -> bool:
            return (await js.stream_info("MEMQ_DLQ")).state.messages == 1

        await wait_for(dead_lettered, what="the rejected event in the DLQ")
        entry = await js.get_msg("MEMQ_DLQ", 1)
        assert entry.headers["Memq-Error-Code"] == "storage_rejected"
        assert entry.headers["Memq-Original-Seq"] == str(bad)
        assert "no_rejects" in entry.headers["Memq-Error"]
        await nc.close()
