"""`memq export`: SQL (the source of truth) as the lines of :mod:`.format`.

Everything is read in keyset pages inside one read transaction (a snapshot on
PostgreSQL and MySQL, where it is REPEATABLE READ), so memory stays bounded by
a page whatever the size of the database, and a live deployment exports a
consistent picture. Deleted sessions (``last_seq <= deleted_seq``) are left
out; a deleted key of a state is exported as a delete, since replaying the
events would otherwise bring it back.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from memq.contracts import codec
from memq.contracts.ids import scope_key, validate_id
from memq.contracts.schemas import (
    SCHEMA_VERSION,
    ArtifactSaved,
    CheckpointSaved,
    ObjectRef,
    SessionCreated,
    StateSet,
)
from memq.workers.memory.state import APP_PREFIX, TOMBSTONE, USER_PREFIX
from memq.workers.sql.engine import dialect_name
from memq.workers.sql.models import (
    APP_STATE,
    ARTIFACTS,
    CHECKPOINTS,
    EVENTS,
    SESSION_STATE,
    SESSIONS,
    USER_STATE,
    USERS,
)
from memq.workers.transfer.format import footer_line, header_line, record_line

EVENT_PAGE = 500
ARTIFACT_PAGE = 16  # inline blobs can be large
ROW_PAGE = 200


@dataclass(frozen=True)
class Scope:
    """What to export: everything, an app, a user of an app, or one session."""

    app: str | None = None
    user: str | None = None
    session: str | None = None

    def __post_init__(self) -> None:
        if self.user is not None and self.app is None:
            raise ValueError("--user needs --app")
        if self.session is not None and self.user is None:
            raise ValueError("--session needs --app and --user")
        for what, value in self.as_dict().items():  # an id no event can have matches nothing, silently
            if value is not None:
                validate_id(value, what)

    def as_dict(self) -> dict[str, str | None]:
        return {"app": self.app, "user": self.user, "session": self.session}


def _visible():
    return SESSIONS.c.last_seq > SESSIONS.c.deleted_seq


def _session_keys(scope: Scope):
    q = select(SESSIONS.c.key).where(_visible())
    if scope.session is not None:
        assert scope.app is not None and scope.user is not None
        return q.where(SESSIONS.c.key == scope_key(scope.app, scope.user, scope.session))
    if scope.user is not None:
        assert scope.app is not None
        return q.where(SESSIONS.c.user_key == scope_key(scope.app, scope.user))
    if scope.app is not None:
        return q.where(SESSIONS.c.app == scope.app)
    return q


async def missing(engine: AsyncEngine, scope: Scope) -> str | None:
    """Why an export of ``scope`` would be empty because what it names does
    not exist ("no such session …"), or None. Only a one-session scope is
    checked: an app or user without sessions may still have state to export."""
    if scope.session is None:
        return None
    async with engine.connect() as conn:
        found = (await conn.execute(_session_keys(scope).limit(1))).first()
    if found is not None:
        return None
    return f"no such session {scope.session!r} of user {scope.user!r} in app {scope.app!r}"


async def count_records(engine: AsyncEngine, scope: Scope) -> int:
    """About how many records an export of ``scope`` writes (for progress):
    a session's own two, its events, artifacts and checkpoints."""
    keys = _session_keys(scope).subquery()
    async with engine.connect() as conn:
        total = 2 * int((await conn.execute(select(func.count()).select_from(keys))).scalar_one())
        for table in (EVENTS, ARTIFACTS, CHECKPOINTS):
            q = select(func.count()).select_from(table.join(keys, table.c.session_key == keys.c.key))
            total += int((await conn.execute(q)).scalar_one())
    return total


async def export_lines(
    engine: AsyncEngine, scope: Scope, *, on_record: Callable[[], None] | None = None
) -> AsyncIterator[bytes]:
    """The export of ``scope``, line by line (header, records, footer)."""
    async with engine.connect() as conn:
        if dialect_name(engine) in ("postgresql", "mysql"):
            await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            yield header_line(time.time(), dialect_name(engine), scope.as_dict())
            records = 0
            async for line in _records(conn, scope):
                records += 1
                if on_record is not None:
                    on_record()
                yield line
            yield footer_line(records)


async def _records(conn: AsyncConnection, scope: Scope) -> AsyncIterator[bytes]:
    if scope.app is not None:
        apps = [scope.app]
    else:  # few apps: held as a list
        apps = [a async for (a,) in _keyset(conn, select(USERS.c.app).distinct(), (USERS.c.app,))]
    for app in apps:
        last_user: str | None = None
        async for user_key, user in _users(conn, app, scope.user):
            async for session_row in _sessions(conn, user_key, scope.session, app, user):
                async for line in _session(conn, app, user, session_row):
                    yield line
            if scope.session is None:
                user_state = USER_STATE.c.user_key == user_key
                if state := await _state_line(conn, USER_STATE, user_state, USER_PREFIX, app, user):
                    yield state
            last_user = user
        # App state rides on a state.set of the app's last user (a message
        # names a user); written after every event that could set it.
        if scope.user is None and last_user is not None:
            if state := await _state_line(conn, APP_STATE, APP_STATE.c.app == app, APP_PREFIX, app, last_user):
                yield state


async def _keyset(conn: AsyncConnection, query, order: tuple, page: int = ROW_PAGE) -> AsyncIterator[tuple]:
    """Rows of ``query`` in ``order`` (unique; its columns are the query's
    last ones), ``page`` at a time: each page an index range from where the
    last one stopped."""
    after: tuple | None = None
    while True:
        q = query.order_by(*order).limit(page)
        if after is not None:
            q = q.where(tuple_(*order) > tuple_(*after)) if len(order) > 1 else q.where(order[0] > after[0])
        rows = (await conn.execute(q)).all()
        for row in rows:
            yield tuple(row)
        if len(rows) < page:
            return
        after = tuple(rows[-1][-len(order) :])


async def _users(conn: AsyncConnection, app: str, user: str | None) -> AsyncIterator[tuple[str, str]]:
    if user is not None:
        yield scope_key(app, user), user
        return
    q = select(USERS.c.user_id, USERS.c.key).where(USERS.c.app == app)
    async for user_id, key in _keyset(conn, q, (USERS.c.key,)):
        yield key, user_id


async def _sessions(
    conn: AsyncConnection, user_key: str, session: str | None, app: str, user: str
) -> AsyncIterator[tuple]:
    columns = (SESSIONS.c.session_id, SESSIONS.c.last_seq, SESSIONS.c.created_at, SESSIONS.c.updated_at, SESSIONS.c.key)
    q = select(*columns).where(SESSIONS.c.user_key == user_key, _visible())
    if session is not None:
        q = q.where(SESSIONS.c.key == scope_key(app, user, session))
    # (updated_at, key): the ix_memq_sessions_user_updated index, in order.
    async for row in _keyset(conn, q, (SESSIONS.c.updated_at, SESSIONS.c.key)):
        yield row


async def _session(conn: AsyncConnection, app: str, user: str, row: tuple) -> AsyncIterator[bytes]:
    session, last_seq, created_at, updated_at, key = row
    ids = {"app": app, "user": user, "session": session}
    yield record_line(None, codec.encode(SessionCreated(**ids, timestamp=created_at)))
    async for _seq, line in _merged(_events(conn, key, ids), _artifacts(conn, key, ids), _checkpoints(conn, key, ids)):
        yield line
    # The final state (and the session's updated_at, the newest write's time).
    delta, deleted, _ = await _state_rows(conn, SESSION_STATE, SESSION_STATE.c.session_key == key, "")
    message = StateSet(**ids, delta=delta, delete=deleted or None, timestamp=updated_at)
    yield record_line(last_seq, codec.encode(message))


async def _events(conn: AsyncConnection, key: str, ids: dict[str, str]) -> AsyncIterator[tuple[int, bytes]]:
    envelope = {"v": SCHEMA_VERSION, "kind": "event", **ids}
    q = select(EVENTS.c.data, EVENTS.c.seq).where(EVENTS.c.session_key == key)
    async for data, seq in _keyset(conn, q, (EVENTS.c.seq,), EVENT_PAGE):
        # The event's JSON as it was published, not parsed and re-encoded.
        message = orjson.dumps({**envelope, "event": orjson.Fragment(data)})
        yield seq, record_line(seq, message)


async def _artifacts(conn: AsyncConnection, key: str, ids: dict[str, str]) -> AsyncIterator[tuple[int, bytes]]:
    a = ARTIFACTS.c
    q = select(
        a.artifact_id,
        a.filename,
        a.mime_type,
        a.size,
        a.sha256,
        a.inline,
        a.object_bucket,
        a.object_name,
        a.created_at,
        a.seq,
    ).where(a.session_key == key)
    async for artifact_id, filename, mime, size, sha, inline, bucket, name, created, seq in _keyset(
        conn, q, (a.seq,), ARTIFACT_PAGE
    ):
        # A large artifact is a reference into the source's object store: the
        # reference is exported, not the object (docs/guide/export.md says so).
        ref = None if inline is not None else ObjectRef(bucket=bucket, name=name, size=size, sha256=sha)
        message = ArtifactSaved(
            **ids, id=artifact_id, filename=filename, mime_type=mime, inline=inline, object=ref, timestamp=created
        )
        yield seq, record_line(seq, codec.encode(message))


async def _checkpoints(conn: AsyncConnection, key: str, ids: dict[str, str]) -> AsyncIterator[tuple[int, bytes]]:
    c = CHECKPOINTS.c
    q = select(c.checkpoint_id, c.up_to_seq, c.summary, c.author, c.created_at, c.seq).where(c.session_key == key)
    async for checkpoint_id, up_to, summary, author, created, seq in _keyset(conn, q, (c.seq,)):
        message = CheckpointSaved(
            **ids, id=checkpoint_id, summary=summary, up_to_seq=up_to, author=author, timestamp=created
        )
        yield seq, record_line(seq, codec.encode(message))


async def _merged(*sources: AsyncIterator[tuple[int, bytes]]) -> AsyncIterator[tuple[int, bytes]]:
    """Items of several seq-ordered sources in one seq order (stream order)."""
    heads: dict[int, tuple[int, bytes]] = {}
    for i, source in enumerate(sources):
        if (item := await anext(source, None)) is not None:
            heads[i] = item
    while heads:
        i = min(heads, key=lambda k: heads[k][0])
        yield heads[i]
        if (item := await anext(sources[i], None)) is not None:
            heads[i] = item
        else:
            del heads[i]


async def _state_rows(conn: AsyncConnection, table, where, prefix: str) -> tuple[dict[str, Any], list[str], int]:
    """(live values, deleted keys, newest seq) of one scope's state rows."""
    delta: dict[str, Any] = {}
    deleted: list[str] = []
    newest = 0
    q = select(table.c.value, table.c.seq, table.c.key).where(where)
    async for value, seq, key in _keyset(conn, q, (table.c.key,)):
        newest = max(newest, seq)
        if value == TOMBSTONE:
            deleted.append(prefix + key)
        else:
            delta[prefix + key] = orjson.loads(value)
    return delta, deleted, newest


async def _state_line(conn: AsyncConnection, table, where, prefix: str, app: str, user: str) -> bytes | None:
    delta, deleted, newest = await _state_rows(conn, table, where, prefix)
    if not (delta or deleted):
        return None
    return record_line(newest, codec.encode(StateSet(app=app, user=user, delta=delta, delete=deleted or None)))
