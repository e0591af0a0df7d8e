"""Read side of the SQL store: what a session holds, in stream order.

Every query here is an index seek or a bounded range scan: sessions by key,
pages of sessions by (app|user, updated_at, key), events by (session, seq),
the latest checkpoint by (session, up_to_seq). None reads a whole session.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson
from sqlalchemy import BigInteger, Integer, String, any_, bindparam, func, or_, select, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncEngine

from memq.contracts.ids import scope_key
from memq.workers.memory.state import TOMBSTONE, merge_state
from memq.workers.sql.driver import fetch_all
from memq.workers.sql.models import APP_STATE, ARTIFACTS, CHECKPOINTS, EVENTS, SESSION_STATE, SESSIONS, USER_STATE


# Not frozen: one is built per row of every read, and a frozen dataclass's
# __init__ costs about four times a plain one's (object.__setattr__ per field).
@dataclass(slots=True)
class StoredEvent:
    seq: int
    event_id: str
    author: str
    role: str | None
    timestamp: float
    data: dict[str, Any]
    tokens: int = 0


async def session_exists(engine: AsyncEngine, app: str, user: str, session: str) -> bool:
    q = select(SESSIONS.c.last_seq > SESSIONS.c.deleted_seq).where(SESSIONS.c.key == scope_key(app, user, session))
    async with engine.connect() as conn:
        return bool((await conn.execute(q)).scalar())


async def count_events(engine: AsyncEngine, app: str, user: str, session: str) -> int:
    q = select(func.count()).select_from(EVENTS).where(EVENTS.c.session_key == scope_key(app, user, session))
    async with engine.connect() as conn:
        return int((await conn.execute(q)).scalar_one())


async def events(engine: AsyncEngine, app: str, user: str, session: str) -> list[StoredEvent]:
    q = select(*EVENT_COLUMNS).where(EVENTS.c.session_key == scope_key(app, user, session)).order_by(EVENTS.c.seq)
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    return [_event(r) for r in rows]


EVENT_COLUMNS = (
    EVENTS.c.seq,
    EVENTS.c.event_id,
    EVENTS.c.author,
    EVENTS.c.role,
    EVENTS.c.timestamp,
    EVENTS.c.data,
    EVENTS.c.tokens,
)


def _event(r) -> StoredEvent:
    seq, event_id, author, role, timestamp, data, tokens = r  # EVENT_COLUMNS' order
    return StoredEvent(seq, event_id, author, role, timestamp, orjson.loads(data), tokens)


async def state(engine: AsyncEngine, app: str, user: str, session: str | None = None) -> dict[str, Any]:
    """Merged state as ADK shows it (``app:`` and ``user:`` keys prefixed)."""
    async with engine.connect() as conn:
        return await merged_state(conn, app, user, session)


# --- for the query service ------------------------------------------------------


@dataclass(frozen=True)
class SessionRow:
    app: str
    user: str
    session: str
    created_at: float
    updated_at: float
    last_seq: int
    # The delete tombstone: events below it are gone. A window cached
    # before a delete (or a re-creation) is stale once it moves.
    deleted_seq: int = 0
    # The newest forget of one of its events: a window cached before it
    # may hold the forgotten event.
    forgot_seq: int = 0


@dataclass(frozen=True)
class CheckpointRow:
    seq: int
    up_to_seq: int
    summary: str
    tokens: int


_VISIBLE = SESSIONS.c.last_seq > SESSIONS.c.deleted_seq
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SESSION_COLUMNS = (
    SESSIONS.c.app,
    SESSIONS.c.user_id,
    SESSIONS.c.session_id,
    SESSIONS.c.created_at,
    SESSIONS.c.updated_at,
    SESSIONS.c.last_seq,
    SESSIONS.c.key,
    SESSIONS.c.deleted_seq,
    SESSIONS.c.forgot_seq,
)
_CP = len(_SESSION_COLUMNS)  # where a checkpoint's columns start after the session's


def _session(r) -> SessionRow:
    # By position (_SESSION_COLUMNS' order): rows may be asyncpg records (driver.fetch_all).
    return SessionRow(r[0], r[1], r[2], r[3], r[4], r[5], r[7], r[8])


def _checkpoint(r) -> CheckpointRow | None:
    # cp_seq, up_to_seq, summary, tokens after the session's columns
    return CheckpointRow(r[_CP], r[_CP + 1], r[_CP + 2], r[_CP + 3]) if r[_CP] is not None else None


# The hot reads of a cache miss are built once, with bind parameters: building
# a select() per call cost about as much CPU as its round trip.
_KEY = bindparam("key", type_=SESSIONS.c.key.type)


@cache
def _session_row():
    return select(*_SESSION_COLUMNS).where(SESSIONS.c.key == _KEY, _VISIBLE)


async def session_row(conn, session_key: str) -> SessionRow | None:
    rows = await fetch_all(conn, _session_row(), {"key": session_key})
    return _session(rows[0]) if rows else None


def encode_cursor(updated_at: float, key: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([updated_at, key])).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    """Raise ValueError on anything but a cursor this module made."""
    try:
        updated_at, key = orjson.loads(base64.urlsafe_b64decode(cursor.encode()))
    except Exception as exc:
        raise ValueError(f"malformed cursor: {exc}") from None
    # A session key is a sha256 in hex: anything else (NUL for one) must not reach SQL.
    if not isinstance(updated_at, (int, float)) or not isinstance(key, str) or not _HEX64.fullmatch(key):
        raise ValueError("malformed cursor")
    return float(updated_at), key


async def session_page(
    conn, app: str, user: str | None, limit: int, cursor: str | None
) -> tuple[list[SessionRow], str | None]:
    """Newest update first, keyset-paginated: page N costs what page 1 costs."""
    scope = SESSIONS.c.user_key == scope_key(app, user) if user is not None else SESSIONS.c.app == app
    q = select(*_SESSION_COLUMNS).where(scope, _VISIBLE)
    if cursor is not None:
        updated_at, key = decode_cursor(cursor)
        # The first condition is a range on the index, so the scan starts at
        # the cursor; the second only breaks ties. (A bare OR is a filter, and
        # page N would scan N pages of index entries.)
        q = q.where(
            SESSIONS.c.updated_at <= updated_at,
            or_(SESSIONS.c.updated_at < updated_at, SESSIONS.c.key < key),
        )
    q = q.order_by(SESSIONS.c.updated_at.desc(), SESSIONS.c.key.desc()).limit(limit + 1)
    rows = (await conn.execute(q)).all()
    next_cursor = encode_cursor(rows[limit - 1].updated_at, rows[limit - 1].key) if len(rows) > limit else None
    return [_session(r) for r in rows[:limit]], next_cursor


def _latest_checkpoint(session_key):
    """Index seek on (session_key, up_to_seq, seq)."""
    return (
        select(CHECKPOINTS.c.seq, CHECKPOINTS.c.up_to_seq, CHECKPOINTS.c.summary, CHECKPOINTS.c.tokens)
        .where(CHECKPOINTS.c.session_key == session_key)
        .order_by(CHECKPOINTS.c.up_to_seq.desc(), CHECKPOINTS.c.seq.desc())
        .limit(1)
    )


async def latest_checkpoint(conn, session_key: str) -> CheckpointRow | None:
    row = (await conn.execute(_latest_checkpoint(session_key))).first()
    return CheckpointRow(row.seq, row.up_to_seq, row.summary, row.tokens) if row else None


@cache
def _session_and_checkpoint():
    c = _latest_checkpoint(_KEY).subquery()
    return (
        select(*_SESSION_COLUMNS, c.c.seq.label("cp_seq"), c.c.up_to_seq, c.c.summary, c.c.tokens)
        .select_from(SESSIONS.outerjoin(c, true()))
        .where(SESSIONS.c.key == _KEY, _VISIBLE)
    )


async def session_and_checkpoint(conn, session_key: str) -> tuple[SessionRow | None, CheckpointRow | None]:
    """The visible session's row and its latest checkpoint in one statement
    (one round trip, one snapshot): the row, outer-joined to the checkpoint
    seek. (None, None) when no such session is visible."""
    rows = await fetch_all(conn, _session_and_checkpoint(), {"key": session_key})
    if not rows:
        return None, None
    return _session(rows[0]), _checkpoint(rows[0])


@cache
def _session_checkpoint_and_newer():
    c = _latest_checkpoint(_KEY).subquery()
    e = (
        select(*(col.label(f"e_{col.name}") for col in EVENT_COLUMNS))
        .where(EVENTS.c.session_key == _KEY, EVENTS.c.seq > bindparam("after", type_=BigInteger))
        .order_by(EVENTS.c.seq.desc())
        .limit(bindparam("limit", type_=Integer))
        .subquery()
    )
    return (
        select(*_SESSION_COLUMNS, c.c.seq.label("cp_seq"), c.c.up_to_seq, c.c.summary, c.c.tokens, *e.c)
        .select_from(SESSIONS.outerjoin(c, true()).outerjoin(e, true()))
        .where(SESSIONS.c.key == _KEY, _VISIBLE)
        .order_by(e.c.e_seq.desc())
    )


def _id_in(array: bool):
    """``event_id IN (ids)``: on PostgreSQL as ``= ANY`` of one array
    parameter, so the statement's text does not depend on how many ids
    there are and it runs as one prepared statement (:func:`fetch_all`);
    elsewhere as SQLAlchemy's expanding IN list."""
    if array:
        return EVENTS.c.event_id == any_(bindparam("ids", type_=ARRAY(String)))
    return EVENTS.c.event_id.in_(bindparam("ids", expanding=True))


@cache
def _session_checkpoint_newer_and_ids(array: bool):
    d = (
        select(EVENTS.c.event_id.label("d_id"), EVENTS.c.seq.label("d_seq"))
        .where(EVENTS.c.session_key == _KEY, _id_in(array))
        .subquery()
    )
    q = _session_checkpoint_and_newer()
    return q.add_columns(d.c.d_id, d.c.d_seq).outerjoin(d, true())


async def session_checkpoint_and_newer(
    conn, session_key: str, *, after_seq: int, limit: int, ids: list[str] | None = None
) -> tuple[SessionRow | None, CheckpointRow | None, list[StoredEvent], dict[str, int]]:
    """:func:`session_and_checkpoint` and :func:`newest_events` (``after_seq``,
    ``limit``) in one statement: one round trip, one snapshot. The row and
    checkpoint repeat on each event's row (one row with no event when none
    is newer). With ``ids``, the same statement also answers
    :func:`stored_event_ids` for them (the last value; each found id
    multiplies the rows, and there are usually none)."""
    params: dict[str, Any] = {"key": session_key, "after": after_seq, "limit": limit}
    e_seq = len(_SESSION_COLUMNS) + 4  # after the checkpoint's four columns
    stored: dict[str, int] = {}
    if ids:
        params["ids"] = ids
        statement = _session_checkpoint_newer_and_ids(conn.dialect.name == "postgresql")
        rows: Sequence[Sequence[Any]] = await fetch_all(conn, statement, params)
        stored = {r[-2]: r[-1] for r in rows if r[-2] is not None}
        rows = list({r[e_seq]: r for r in rows}.values())  # once per event again
        width = len(EVENT_COLUMNS) + 2
        newer = [_event(r[-width:-2]) for r in rows if r[e_seq] is not None]
    else:
        rows = await fetch_all(conn, _session_checkpoint_and_newer(), params)
        newer = [_event(r[-len(EVENT_COLUMNS) :]) for r in rows if r[e_seq] is not None]
    if not rows:
        return None, None, [], {}
    return _session(rows[0]), _checkpoint(rows[0]), newer, stored


async def stored_event_ids(conn, session_key: str, ids: list[str]) -> dict[str, int]:
    """The seq of each of ``ids`` that the session holds: the event id is
    the idempotency key, so an event with one of them at another seq is not
    written again."""
    if not ids:
        return {}
    statement = _stored_event_ids(conn.dialect.name == "postgresql")
    return {event_id: seq for event_id, seq in await fetch_all(conn, statement, {"key": session_key, "ids": ids})}


@cache
def _stored_event_ids(array: bool):
    return select(EVENTS.c.event_id, EVENTS.c.seq).where(EVENTS.c.session_key == _KEY, _id_in(array))


async def sessions_over_tokens(conn, limit: int) -> list[tuple[str, str, str]]:
    """(app, user, session) of every live session whose tokens after its
    latest checkpoint, plus that checkpoint's summary, pass ``limit``: the
    summarizer's sweep, one aggregate query."""
    s, e, c = SESSIONS, EVENTS, CHECKPOINTS
    latest = select(c.c.session_key, func.max(c.c.up_to_seq).label("up")).group_by(c.c.session_key).subquery()
    # The summary counts in the budget too (as in strategies.select), so
    # its tokens join the sum: that of the latest checkpoint's row(s).
    summary = (
        select(c.c.session_key, func.max(c.c.tokens).label("tokens"))
        .join(latest, (latest.c.session_key == c.c.session_key) & (latest.c.up == c.c.up_to_seq))
        .group_by(c.c.session_key)
        .subquery()
    )
    q = (
        select(s.c.app, s.c.user_id, s.c.session_id)
        .select_from(
            s.join(e, e.c.session_key == s.c.key)
            .outerjoin(latest, latest.c.session_key == s.c.key)
            .outerjoin(summary, summary.c.session_key == s.c.key)
        )
        .where(s.c.last_seq > s.c.deleted_seq, e.c.seq > func.coalesce(latest.c.up, 0))
        .group_by(s.c.key, s.c.app, s.c.user_id, s.c.session_id)
        .having(func.sum(e.c.tokens) + func.coalesce(func.max(summary.c.tokens), 0) > limit)
    )
    return [(r.app, r.user_id, r.session_id) for r in (await conn.execute(q)).all()]


@dataclass(frozen=True)
class EventFilter:
    """Which events of a session a read keeps (see :class:`memq.contracts.queries.SessionGet`).

    :param after: only events with ``timestamp > after`` (unix seconds). Default None: any.
    :param roles: only events whose message has one of these roles. Default (): any.
    """

    after: float | None = None
    roles: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.after is not None or bool(self.roles)

    def where(self, q):
        # In SQL, on top of the (session_key, seq) range. A planner with
        # statistics (PostgreSQL, MariaDB) may take the (session_key,
        # timestamp) index instead when few events pass; SQLite walks seq.
        if self.after is not None:
            q = q.where(EVENTS.c.timestamp > self.after)
        if self.roles:
            q = q.where(EVENTS.c.role.in_(self.roles))
        return q


NO_FILTER = EventFilter()


@cache
def _newest_events(bounded: bool):
    q = select(*EVENT_COLUMNS).where(EVENTS.c.session_key == _KEY, EVENTS.c.seq > bindparam("after", type_=BigInteger))
    if bounded:
        q = q.where(EVENTS.c.seq < bindparam("before", type_=BigInteger))
    return q.order_by(EVENTS.c.seq.desc()).limit(bindparam("limit", type_=Integer))


async def newest_events(
    conn,
    session_key: str,
    *,
    after_seq: int = 0,
    before_seq: int | None = None,
    limit: int,
    only: EventFilter = NO_FILTER,
) -> list[StoredEvent]:
    """Up to ``limit`` events with after_seq < seq < before_seq that pass
    ``only`` (default: all), newest first."""
    if not only:
        params = {"key": session_key, "after": after_seq, "before": before_seq, "limit": limit}
        return [_event(r) for r in await fetch_all(conn, _newest_events(before_seq is not None), params)]
    q = select(*EVENT_COLUMNS).where(EVENTS.c.session_key == session_key, EVENTS.c.seq > after_seq)
    if before_seq is not None:
        q = q.where(EVENTS.c.seq < before_seq)
    q = only.where(q).order_by(EVENTS.c.seq.desc()).limit(limit)
    return [_event(r) for r in (await conn.execute(q)).all()]


async def events_after(
    conn,
    session_key: str,
    after_seq: int,
    limit: int,
    *,
    up_to_seq: int | None = None,
    only: EventFilter = NO_FILTER,
) -> list[StoredEvent]:
    """Up to ``limit`` events with after_seq < seq <= up_to_seq (default: no
    upper bound) that pass ``only`` (default: all), oldest first."""
    q = select(*EVENT_COLUMNS).where(EVENTS.c.session_key == session_key, EVENTS.c.seq > after_seq)
    if up_to_seq is not None:
        q = q.where(EVENTS.c.seq <= up_to_seq)
    q = only.where(q).order_by(EVENTS.c.seq).limit(limit)
    return [_event(r) for r in (await conn.execute(q)).all()]


async def artifact_list(conn, session_key: str) -> list[dict[str, Any]]:
    a = ARTIFACTS.c
    q = (
        select(a.filename, func.count().label("versions"), func.max(a.seq).label("latest_seq"))
        .where(a.session_key == session_key)
        .group_by(a.filename)
        .order_by(a.filename)
    )
    listing = (await conn.execute(q)).all()
    out = []
    for r in listing:
        latest = (
            await conn.execute(
                select(a.mime_type, a.size).where(
                    a.session_key == session_key, a.filename == r.filename, a.seq == r.latest_seq
                )
            )
        ).first()
        out.append(
            {
                "filename": r.filename,
                "versions": r.versions,
                "latest_seq": r.latest_seq,
                "mime_type": latest.mime_type,
                "size": latest.size,
            }
        )
    return out


async def artifact_version(conn, session_key: str, filename: str, version: int | None):
    """Version n is the n-th save of the file in stream order (0-based); None = latest."""
    a = ARTIFACTS.c
    q = select(ARTIFACTS).where(a.session_key == session_key, a.filename == filename)
    if version is None:
        q = q.order_by(a.seq.desc()).limit(1)
    else:
        q = q.order_by(a.seq).offset(version).limit(1)
    row = (await conn.execute(q)).first()
    if row is None:
        return None, None
    if version is None:
        count = await conn.execute(select(func.count()).where(a.session_key == session_key, a.filename == filename))
        version = int(count.scalar_one()) - 1
    return row, version


def _live_values(rows) -> dict[str, Any]:
    # A deleted key's row stays as a tombstone (its seq orders later writes).
    return {k: orjson.loads(v) for k, v in rows if v != TOMBSTONE}


async def merged_state(conn, app: str, user: str, session: str | None) -> dict[str, Any]:
    rows = await conn.execute(select(APP_STATE.c.key, APP_STATE.c.value).where(APP_STATE.c.app == app))
    app_state = _live_values(rows)
    rows = await conn.execute(
        select(USER_STATE.c.key, USER_STATE.c.value).where(USER_STATE.c.user_key == scope_key(app, user))
    )
    user_state = _live_values(rows)
    session_state: dict[str, Any] = {}
    if session is not None:
        rows = await conn.execute(
            select(SESSION_STATE.c.key, SESSION_STATE.c.value).where(
                SESSION_STATE.c.session_key == scope_key(app, user, session)
            )
        )
        session_state = _live_values(rows)
    return merge_state(app_state, user_state, session_state)


# --- for rebuilding the index from SQL -------------------------------------------


def _visible_sessions(app: str | None, user: str | None):
    q = select(SESSIONS.c.key, SESSIONS.c.app, SESSIONS.c.user_id, SESSIONS.c.session_id).where(
        SESSIONS.c.last_seq > SESSIONS.c.deleted_seq
    )
    if user is not None:
        q = q.where(SESSIONS.c.user_key == scope_key(app, user))
    elif app is not None:
        q = q.where(SESSIONS.c.app == app)
    return q


async def count_indexable(engine: AsyncEngine, *, app: str | None = None, user: str | None = None) -> int:
    """Events and checkpoints of the visible sessions in scope (for progress)."""
    keys = _visible_sessions(app, user).subquery()
    total = 0
    async with engine.connect() as conn:
        for table in (EVENTS, CHECKPOINTS):
            q = select(func.count()).select_from(table.join(keys, table.c.session_key == keys.c.key))
            total += int((await conn.execute(q)).scalar_one())
    return total


async def indexable_messages(engine: AsyncEngine, *, app: str | None = None, user: str | None = None, page: int = 256):
    """Yield lists of ``(seq, stream message)`` rebuilt from SQL, session by
    session (each read is a range scan on (session_key, seq)); within a
    session, events and checkpoints in seq order. Deleted data is not in SQL."""
    from memq.contracts.schemas import CheckpointSaved, Event, EventAppended  # the wire models

    async with engine.connect() as conn:
        sessions = (await conn.execute(_visible_sessions(app, user).order_by(SESSIONS.c.key))).all()
    for s in sessions:
        after = 0
        while True:
            async with engine.connect() as conn:
                evs = (
                    await conn.execute(
                        select(EVENTS.c.seq, EVENTS.c.data)
                        .where(EVENTS.c.session_key == s.key, EVENTS.c.seq > after)
                        .order_by(EVENTS.c.seq)
                        .limit(page)
                    )
                ).all()
                cps = (
                    await conn.execute(
                        select(CHECKPOINTS)
                        .where(CHECKPOINTS.c.session_key == s.key, CHECKPOINTS.c.seq > after)
                        .order_by(CHECKPOINTS.c.seq)
                        .limit(page)
                    )
                ).all()
            if not evs and not cps:
                break
            # Everything up to the smaller of the two pages' last seqs is complete.
            horizon = min(x[-1].seq if len(x) == page else float("inf") for x in (evs, cps))
            out = [
                (
                    r.seq,
                    EventAppended(
                        app=s.app, user=s.user_id, session=s.session_id, event=Event.model_validate_json(r.data)
                    ),
                )
                for r in evs
                if r.seq <= horizon
            ] + [
                (
                    r.seq,
                    CheckpointSaved(
                        app=s.app,
                        user=s.user_id,
                        session=s.session_id,
                        id=r.checkpoint_id,
                        summary=r.summary,
                        up_to_seq=r.up_to_seq,
                        author=r.author or "summarizer",
                        timestamp=r.created_at,
                    ),
                )
                for r in cps
                if r.seq <= horizon
            ]
            out.sort(key=lambda item: item[0])
            yield out
            after = out[-1][0]
