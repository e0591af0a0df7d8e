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


@cache
def _insert_ignore(table: Table, columns: tuple[str, ...]) -> TextClause:
    cols = ", ".join(_QUOTE(c) for c in columns)
    arrays = ", ".join(f"CAST(:{c} AS {_array_type(table, c)})" for c in columns)
    # ORDINALITY keeps the rows in input order, so that of two rows with the
    # same key the first one stays, as with one INSERT per row.
    return text(
        f"INSERT INTO {_QUOTE(table.name)} ({cols}) "
        f"SELECT {cols} FROM unnest({arrays}) WITH ORDINALITY AS r({cols}, ord) ORDER BY ord "
        f"ON CONFLICT DO NOTHING"
    )


async def insert_ignore(conn: AsyncConnection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT … ON CONFLICT DO NOTHING of ``rows`` (dicts with the same keys)
    in one statement."""
    if not rows:
        return
    columns = tuple(rows[0])
    await conn.execute(_insert_ignore(table, columns), {c: [row[c] for row in rows] for c in columns})


@cache
def _touch_sessions(table: Table) -> TextClause:
    name = _QUOTE(table.name)
    # The rows are locked first, in key order (the CTE is materialised, so it
    # runs as written), as one UPDATE per session in sorted order did: two
    # replicas touching the same sessions wait for each other, never deadlock.
    # created_at is set once, by the first commit that makes the session visible.
    return text(
        f"WITH locked AS MATERIALIZED (SELECT key FROM {name} WHERE key = ANY(CAST(:keys AS text[])) "
        "ORDER BY key FOR UPDATE) "
        f"UPDATE {name} AS s SET "
        "created_at = CASE WHEN s.created_at = 0 THEN t.t_at ELSE s.created_at END, "
        "last_seq = GREATEST(s.last_seq, t.t_seq), "
        "updated_at = GREATEST(s.updated_at, t.t_at) "
        "FROM unnest(CAST(:keys AS text[]), CAST(:seqs AS bigint[]), CAST(:ats AS float8[])) AS t(t_key, t_seq, t_at) "
        "WHERE s.key = t.t_key AND s.key IN (SELECT key FROM locked)"
    )


async def touch_sessions(conn: AsyncConnection, table: Table, touched: Sequence[tuple[str, int, float]]) -> None:
    """For each (session key, last seq, updated at): raise the session's
    ``last_seq`` and ``updated_at``, and set ``created_at`` if unset; one
    statement. Keys must be distinct."""
    if not touched:
        return
    keys, seqs, ats = zip(*touched, strict=True)
    await conn.execute(_touch_sessions(table), {"keys": list(keys), "seqs": list(seqs), "ats": list(ats)})
