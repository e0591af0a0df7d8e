"""Whole-batch writes for PostgreSQL: one statement for all rows, not one per row.

An ``executemany`` of a batch's events runs the INSERT once per row on the
server and builds a parameter set per row in SQLAlchemy; here the rows travel
as one array per column and ``unnest`` turns them back into rows, so the
statement text is fixed (prepared once per connection) and runs once.

Arrays are cast to the base types (``text``, not ``varchar(n)``): an explicit
cast to ``varchar(n)`` would silently truncate, while the INSERT's own
assignment to a ``varchar(n)`` column fails on a value that is too long, as a
row-by-row INSERT does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from sqlalchemy import Float, Integer, String, TextClause, TypeDecorator, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.schema import Table

from memq.workers.sql.driver import fetch_all

_QUOTE = postgresql.dialect().identifier_preparer.quote
# By SQLAlchemy type class (BigInteger is an Integer, Text a String).
_ARRAY_TYPES = ((String, "text[]"), (Integer, "bigint[]"), (Float, "float8[]"))


def _array_type(table: Table, column: str) -> str:
    kind = table.c[column].type
    if isinstance(kind, TypeDecorator):  # sqlmodel's AutoString wraps a String
        kind = kind.impl_instance
    for cls, array in _ARRAY_TYPES:
        if isinstance(kind, cls):
            return array
    raise TypeError(f"no array type for {table.name}.{column} ({kind!r})")


def _insert_ignore_sql(table: Table, columns: tuple[str, ...]) -> str:
    cols = ", ".join(_QUOTE(c) for c in columns)
    arrays = ", ".join(f"CAST(:{c} AS {_array_type(table, c)})" for c in columns)
    # ORDINALITY keeps the rows in input order, so that of two rows with the
    # same key the first one stays, as with one INSERT per row.
    return (
        f"INSERT INTO {_QUOTE(table.name)} ({cols}) "
        f"SELECT {cols} FROM unnest({arrays}) WITH ORDINALITY AS r({cols}, ord) ORDER BY ord "
        f"ON CONFLICT DO NOTHING"
    )


@cache
def _insert_ignore(table: Table, columns: tuple[str, ...]) -> TextClause:
    return text(_insert_ignore_sql(table, columns))


def _columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    return {c: [row[c] for row in rows] for c in rows[0]}


async def insert_ignore(conn: AsyncConnection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT … ON CONFLICT DO NOTHING of ``rows`` (dicts with the same keys)
    in one statement."""
    if not rows:
        return
    await conn.execute(_insert_ignore(table, tuple(rows[0])), _columns(rows))


def _touch_sql(table: Table) -> str:
    name = _QUOTE(table.name)
    # The rows are locked first, in key order (the CTE is materialised, so it
    # runs as written), as one UPDATE per session in sorted order did: two
    # replicas touching the same sessions wait for each other, never deadlock.
    # created_at is set once, by the first commit that makes the session visible.
    # RETURNING gives each row's tombstone as it is now (an UPDATE reads the
    # newest committed row version), which the caller checks its plan against.
    return (
        f"locked AS MATERIALIZED (SELECT key FROM {name} WHERE key = ANY(CAST(:keys AS text[])) "
        "ORDER BY key FOR UPDATE) "
        f"UPDATE {name} AS s SET "
        "created_at = CASE WHEN s.created_at = 0 THEN t.t_at ELSE s.created_at END, "
        "last_seq = GREATEST(s.last_seq, t.t_seq), "
        # Over an older updated_seq only (memq.workers.memory.commit_plan.Touch);
        # every SET expression reads the row as it was.
        "updated_at = CASE WHEN t.t_useq > s.updated_seq THEN t.t_at "
        "WHEN t.t_useq = 0 AND s.updated_seq = 0 THEN GREATEST(s.updated_at, t.t_at) ELSE s.updated_at END, "
        "updated_seq = GREATEST(s.updated_seq, t.t_useq) "
        "FROM unnest(CAST(:keys AS text[]), CAST(:seqs AS bigint[]), CAST(:useqs AS bigint[]), "
        "CAST(:ats AS float8[])) AS t(t_key, t_seq, t_useq, t_at) "
        "WHERE s.key = t.t_key AND s.key IN (SELECT key FROM locked) "
        "RETURNING s.key, s.deleted_seq"
    )


@cache
def _touch_sessions(table: Table) -> TextClause:
    return text(f"WITH {_touch_sql(table)}")


@cache
def _insert_and_touch(table: Table, columns: tuple[str, ...], sessions: Table) -> TextClause:
    # One statement, one round trip: the events INSERT runs as a data-modifying
    # CTE. It takes no lock on session rows (no foreign keys), so the lock
    # order of the touch is unchanged.
    return text(f"WITH inserted AS ({_insert_ignore_sql(table, columns)}), {_touch_sql(sessions)}")


async def touch_sessions(
    conn: AsyncConnection,
    table: Table,
    touched: Sequence[tuple[str, int, int, float]],
    *,
    insert_into: Table | None = None,
    rows: Sequence[Mapping[str, Any]] = (),
) -> dict[str, int]:
    """For each (session key, last seq, updated seq, updated at): raise the
    session's ``last_seq``, set its ``updated_at`` if ``updated_seq`` is newer
    than the stored one (see :class:`~memq.workers.memory.commit_plan.Touch`),
    and set ``created_at`` if unset; one
    statement, which also inserts ``rows`` into ``insert_into`` (as
    :func:`insert_ignore`) when given. Keys must be distinct. Returns the
    touched sessions' ``deleted_seq`` as stored now."""
    if not touched:
        if insert_into is not None:
            await insert_ignore(conn, insert_into, rows)
        return {}
    keys, seqs, useqs, ats = zip(*touched, strict=True)
    params: dict[str, Any] = {"keys": list(keys), "seqs": list(seqs), "useqs": list(useqs), "ats": list(ats)}
    stmt = _touch_sessions(table)
    if insert_into is not None and rows:
        stmt = _insert_and_touch(insert_into, tuple(rows[0]), table)
        params.update(_columns(rows))
    return dict((await conn.execute(stmt, params)).all())


@cache
def _share_users_read_sessions(users: Table, sessions: Table) -> TextClause:
    return text(
        f"WITH u AS (SELECT key, deleted_seq FROM {_QUOTE(users.name)} "
        "WHERE key = ANY(CAST(:users AS text[])) ORDER BY key FOR SHARE) "
        "SELECT true, key, deleted_seq FROM u UNION ALL "
        f"SELECT false, key, deleted_seq FROM {_QUOTE(sessions.name)} WHERE key = ANY(CAST(:sessions AS text[]))"
    )


async def share_users_read_sessions(
    conn: AsyncConnection, users: Table, sessions: Table, user_keys: Sequence[str], session_keys: Sequence[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """One statement: lock the existing rows among ``user_keys`` (sorted)
    FOR SHARE and read the ``deleted_seq`` of those and of the existing rows
    among ``session_keys``.

    The user tombstones are current (a locking read returns the newest row
    version). The session tombstones come from the statement's snapshot, taken
    before the locks were granted: a delete that committed while this waited is
    missing from them, so they are only a guess, to be checked by a later
    statement of the transaction (see :func:`touch_sessions`)."""
    params = {"users": list(user_keys), "sessions": list(session_keys)}
    user_tombs: dict[str, int] = {}
    session_tombs: dict[str, int] = {}
    for is_user, key, deleted_seq in (await conn.execute(_share_users_read_sessions(users, sessions), params)).all():
        (user_tombs if is_user else session_tombs)[key] = deleted_seq
    return user_tombs, session_tombs


def _append_only_sql(events: Table, columns: tuple[str, ...], sessions: Table, users: Table) -> str:
    ev, ss, us = _QUOTE(events.name), _QUOTE(sessions.name), _QUOTE(users.name)
    cols = ", ".join(_QUOTE(c) for c in columns)
    arrays = ", ".join(f"CAST(:{c} AS {_array_type(events, c)})" for c in columns)
    # The session rows are locked first, in key order, as _touch_sql does;
    # FOR UPDATE returns each row's newest version, so a delete that committed
    # while this waited is seen. A user delete raises the tombstone of every
    # session of the user in the same transaction, so the locked row covers
    # it; the user row (read in the snapshot) covers a session created after
    # an earlier user delete. Events below the tombstone are not written, and
    # a session is only touched by the events kept (it stays deleted).
    return (
        f"WITH locked AS MATERIALIZED (SELECT key, user_key, deleted_seq FROM {ss} "
        "WHERE key = ANY(CAST(:keys AS text[])) ORDER BY key FOR UPDATE), "
        "tomb AS (SELECT l.key, GREATEST(l.deleted_seq, COALESCE(u.deleted_seq, 0)) AS t "
        f"FROM locked l LEFT JOIN {us} u ON u.key = l.user_key), "
        f"r AS (SELECT * FROM unnest({arrays}) WITH ORDINALITY AS r({cols}, ord)), "
        "kept AS (SELECT r.* FROM r JOIN tomb ON tomb.key = r.session_key WHERE r.seq >= tomb.t), "
        f"inserted AS (INSERT INTO {ev} ({cols}) SELECT {cols} FROM kept ORDER BY ord ON CONFLICT DO NOTHING), "
        # t_at: the time of the session's newest event in the batch, stored
        # over an older updated_seq only (see _touch_sql).
        "touch AS (SELECT session_key, max(seq) AS t_seq, "
        '(array_agg("timestamp" ORDER BY seq DESC))[1] AS t_at FROM kept GROUP BY session_key), '
        f"upd AS (UPDATE {ss} AS s SET "
        "created_at = CASE WHEN s.created_at = 0 THEN t.t_at ELSE s.created_at END, "
        "last_seq = GREATEST(s.last_seq, t.t_seq), "
        "updated_at = CASE WHEN t.t_seq > s.updated_seq THEN t.t_at ELSE s.updated_at END, "
        "updated_seq = GREATEST(s.updated_seq, t.t_seq) "
        "FROM touch t WHERE s.key = t.session_key AND s.key IN (SELECT key FROM locked) RETURNING s.key) "
        "SELECT (SELECT count(*) FROM locked), ARRAY(SELECT seq FROM kept), (SELECT count(*) FROM upd)"
    )


@cache
def _append_only(events: Table, columns: tuple[str, ...], sessions: Table, users: Table) -> TextClause:
    return text(_append_only_sql(events, columns, sessions, users))


async def append_only(
    conn: AsyncConnection,
    events: Table,
    sessions: Table,
    users: Table,
    rows: Sequence[Mapping[str, Any]],
    session_keys: Sequence[str],
) -> set[int] | None:
    """Commit a batch that only appends events to sessions that exist, in one
    statement (on an autocommit connection: one round trip, no BEGIN or
    COMMIT): insert the ``rows`` at or above their session's tombstone, and
    touch the sessions by the rows kept. Returns the seqs of the rows kept,
    or None when some of ``session_keys`` has no row yet (then nothing may
    rely on this call: the caller commits the batch the full way, which is
    safe to repeat)."""
    params: dict[str, Any] = {"keys": sorted(session_keys), **_columns(rows)}
    # On the driver's prepared statement: a lone append's commit is on the
    # agent's turn (driver.fetch_all). One statement in autocommit: if it
    # fails it did nothing, and it is idempotent anyway.
    (found, kept, _), *_ = await fetch_all(conn, _append_only(events, tuple(rows[0]), sessions, users), params)
    return set(kept) if found == len(session_keys) else None


@cache
def _stored_events(events: Table) -> TextClause:
    # A nested loop of primary-key seeks, one per pair; a row-value IN list
    # of hundreds of pairs is planned as a scan of the table instead.
    return text(
        f"SELECT e.session_key, e.event_id, e.seq, e.data "
        f"FROM unnest(CAST(:keys AS text[]), CAST(:ids AS text[])) AS k(session_key, event_id) "
        f"JOIN {_QUOTE(events.name)} e ON e.session_key = k.session_key AND e.event_id = k.event_id"
    )


async def stored_events(
    conn: AsyncConnection, events: Table, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], tuple[int, str]]:
    """(seq, data) of the stored events among the (session key, event id) pairs ``keys``, in one statement."""
    params = {"keys": [k for k, _ in keys], "ids": [i for _, i in keys]}
    rows = await fetch_all(conn, _stored_events(events), params)
    return {(key, event_id): (seq, data) for key, event_id, seq, data in rows}
