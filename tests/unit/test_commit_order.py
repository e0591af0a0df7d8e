"""Whatever the batching and the commit order of replicas, SQL ends equal to
applying the stream in order (docs/design.md, Guarantees). Run against the real SQL store on
SQLite in memory, with hypothesis choosing messages, batches and order."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memq.contracts.schemas import (
    Actions,
    CheckpointSaved,
    Event,
    EventAppended,
    SessionCreated,
    SessionDeleted,
    StateSet,
    UserDeleted,
)
from memq.workers.memory.commit_plan import Incoming
from memq.workers.persistence.store import SqlStore
from memq.workers.sql import reads
from memq.workers.sql.engine import create_engine, migrate

APP = "app"
USERS = ["u1", "u2"]
SESSIONS = ["s1", "s2"]
KEYS = ["k", "app:a", "user:u", "temp:t"]

deltas = st.dictionaries(st.sampled_from(KEYS), st.integers(0, 5) | st.none(), max_size=3)


@st.composite
def messages(draw):
    user = draw(st.sampled_from(USERS))
    session = draw(st.sampled_from(SESSIONS))
    kind = draw(
        st.sampled_from(
            [
                "event",
                "event",
                "event",
                "create",
                "state",
                "unset",
                "unset",
                "checkpoint",
                "delete_session",
                "delete_user",
            ]
        )
    )
    if kind == "event":
        return EventAppended(
            app=APP, user=user, session=session, event=Event(actions=Actions(state_delta=draw(deltas)))
        )
    if kind == "create":
        return SessionCreated(app=APP, user=user, session=session, state=draw(deltas))
    if kind == "checkpoint":
        return CheckpointSaved(app=APP, user=user, session=session, summary="s", up_to_seq=draw(st.integers(1, 9)))
    if kind == "state":
        return StateSet(app=APP, user=user, session=session, delta=draw(deltas))
    if kind == "unset":  # delete some keys, maybe setting others in the same message
        gone = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
        delta = {k: v for k, v in draw(deltas).items() if k not in gone}
        return StateSet(app=APP, user=user, session=session, delta=delta, delete=gone)
    if kind == "delete_session":
        return SessionDeleted(app=APP, user=user, session=session)
    return UserDeleted(app=APP, user=user)


GONE = object()


def expected(stream: list) -> dict:
    """Replay the stream in order with the plain semantics of each message."""
    events: dict[tuple, list[str]] = {}
    state: dict[tuple, dict] = {}  # (scope...) -> {key: value}
    for m in stream:
        sk = (m.app, m.user, getattr(m, "session", None))
        if isinstance(m, UserDeleted):
            for k in [k for k in events if k[:2] == (m.app, m.user)]:
                events.pop(k)
            for k in [k for k in state if k[:2] == (m.app, m.user)]:
                state.pop(k)
            continue
        if isinstance(m, SessionDeleted):
            events.pop(sk, None)
            state.pop(sk, None)
            continue
        delta = {}
        if isinstance(m, CheckpointSaved):
            events.setdefault(sk, []).append(m.id)
        if isinstance(m, EventAppended):
            events.setdefault(sk, []).append(m.event.id)
            delta = m.event.actions.state_delta
        elif isinstance(m, SessionCreated):
            delta = m.state
        elif isinstance(m, StateSet):
            delta = m.delta
        gone = m.delete or [] if isinstance(m, StateSet) else []
        for key, value in [*delta.items(), *((k, GONE) for k in gone)]:
            if key.startswith("temp:"):
                continue
            if key.startswith("app:"):
                scope = state.setdefault((m.app,), {})
            elif key.startswith("user:"):
                scope = state.setdefault((m.app, m.user, None, "user"), {})
            else:
                scope = state.setdefault(sk, {})
            if value is GONE:
                scope.pop(key, None)
            else:
                scope[key] = value
    state = {scope: values for scope, values in state.items() if values}
    return {"events": events, "state": state}


async def stored_ids(engine, user: str, session: str) -> list[str]:
    """Event and checkpoint ids of a session, in stream order."""
    from sqlalchemy import select, union_all

    from memq.contracts.ids import scope_key
    from memq.workers.sql import models

    e, c = models.Event.__table__, models.Checkpoint.__table__
    key = scope_key(APP, user, session)
    q = union_all(
        select(e.c.seq, e.c.event_id.label("id")).where(e.c.session_key == key),
        select(c.c.seq, c.c.checkpoint_id.label("id")).where(c.c.session_key == key),
    ).order_by("seq")
    async with engine.connect() as conn:
        return [r.id for r in await conn.execute(q)]


async def observed(engine) -> dict:
    events, state = {}, {}
    for user in USERS:
        for session in SESSIONS:
            ids = await stored_ids(engine, user, session)
            if ids:
                events[(APP, user, session)] = ids
            merged = await reads.state(engine, APP, user, session)
            own = {k: v for k, v in merged.items() if not k.startswith(("app:", "user:"))}
            if own:
                state[(APP, user, session)] = own
        merged = await reads.state(engine, APP, user)
        users = {k: v for k, v in merged.items() if k.startswith("user:")}
        if users:
            state[(APP, user, None, "user")] = users
    apps = {k: v for k, v in (await reads.state(engine, APP, USERS[0])).items() if k.startswith("app:")}
    if apps:
        state[(APP,)] = apps
    return {"events": events, "state": state}


async def commit_all(batches: list[list[Incoming]]) -> dict:
    engine = create_engine("sqlite+aiosqlite:///:memory:")
    try:
        await migrate(engine)
        store = SqlStore(engine)
        for batch in batches:
            await store.commit(batch)
        return await observed(engine)
    finally:
        await engine.dispose()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=st.lists(messages(), min_size=1, max_size=25),
    cuts=st.lists(st.integers(0, 25), max_size=6),
    order=st.randoms(use_true_random=False),
    redeliver=st.booleans(),
)
def test_any_batching_and_commit_order_equals_stream_order(stream, cuts, order, redeliver):
    items = [Incoming(seq, m) for seq, m in enumerate(stream, start=1)]
    bounds = sorted({0, len(items), *[c for c in cuts if c < len(items)]})
    batches = [items[a:b] for a, b in zip(bounds, bounds[1:])]
    order.shuffle(batches)
    if redeliver:  # at-least-once delivery: a batch committed twice, late
        batches.append(batches[0])
    assert asyncio.run(commit_all(batches)) == expected(stream)


def test_temp_keys_are_never_stored_and_scopes_are_shared():
    stream = [
        SessionCreated(app=APP, user="u1", session="s1", state={"k": 1, "temp:t": 1, "user:u": 1, "app:a": 1}),
        EventAppended(app=APP, user="u2", session="s2", event=Event(actions=Actions(state_delta={"app:a": 2}))),
    ]
    got = asyncio.run(commit_all([[Incoming(i, m) for i, m in enumerate(stream, 1)]]))
    assert got["state"] == {
        (APP, "u1", "s1"): {"k": 1},
        (APP, "u1", None, "user"): {"user:u": 1},
        (APP,): {"app:a": 2},  # shared across users: the later write wins
    }


def test_a_later_delete_removes_every_kind_of_row_committed_before():
    stream = [
        SessionCreated(app=APP, user="u1", session="s1", state={"k": 1, "user:u": 1}),
        EventAppended(app=APP, user="u1", session="s1", event=Event()),
        CheckpointSaved(app=APP, user="u1", session="s1", summary="s", up_to_seq=2),
        EventAppended(app=APP, user="u1", session="s2", event=Event()),
        SessionDeleted(app=APP, user="u1", session="s1"),
        UserDeleted(app=APP, user="u1"),
    ]
    items = [Incoming(i, m) for i, m in enumerate(stream, 1)]
    for cut in (4, 5):  # the deletes arrive in a batch of their own
        assert asyncio.run(commit_all([items[:cut], items[cut:]])) == expected(stream) == {"events": {}, "state": {}}


def test_a_deleted_state_key_stays_deleted_whatever_the_commit_order():
    """A set from before the delete, committed after it, must not bring the
    key back; a set after the delete creates it again. In every scope."""
    keys = ["k", "user:u", "app:a"]
    stream = [
        StateSet(app=APP, user="u1", session="s1", delta={k: "old" for k in keys}),
        StateSet(app=APP, user="u1", session="s1", delta={"k2": None, "user:u2": None}),  # null is a value
        StateSet(app=APP, user="u1", session="s1", delta={}, delete=keys),
        StateSet(app=APP, user="u1", session="s1", delta={"app:a": "new"}),
    ]
    items = [Incoming(i, m) for i, m in enumerate(stream, 1)]
    want = {
        (APP, "u1", "s1"): {"k2": None},
        (APP, "u1", None, "user"): {"user:u2": None},
        (APP,): {"app:a": "new"},
    }
    for batches in (
        [items],  # one batch
        [items[2:3], items[:2], items[3:]],  # the delete first, the stale sets after it
        [items[3:], items[2:3], items[:2]],  # newest first
        [items[2:3], items[2:3], items[:2], items[3:]],  # the delete redelivered
    ):
        got = asyncio.run(commit_all(batches))
        assert got["state"] == want == expected(stream)["state"], batches
