"""The hottest reads on the database driver's own prepared statements.

SQLAlchemy's execution layer (a greenlet hop, an execution context, the
DB-API cursor adapter, result rows) costs more than the round trip itself
for the statements of an agent's turn: the persistence worker's commit of
an append (:func:`memq.workers.persistence.pg_bulk.append_only`) and the
query worker's reads (:mod:`memq.workers.sql.reads`). The window read after an append (one
statement) took 0.32 ms p50 through ``AsyncConnection.execute`` on a held
connection and 0.14 ms as the same SQL text on asyncpg's prepared statement
(PostgreSQL 15, 2-core VM, 3,000 calls each). So on asyncpg, the statements
passed to :func:`fetch_all` are compiled once by SQLAlchemy, to the text it
would send itself, and run on the checked-out connection's asyncpg
connection; other drivers go through SQLAlchemy as before. SQLAlchemy still
owns the connection: the pool, checkout, autocommit and invalidation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Select, TextClause

_ASYNCPG = asyncpg_dialect()


@dataclass(frozen=True)
class _Compiled:
    sql: str  # with $n parameters and the casts SQLAlchemy adds for asyncpg
    names: tuple[str, ...]  # the bind parameter of each $n
    literals: Mapping[str, Any]  # values bound when the statement was built (a LIMIT 1)


@cache
def _compiled(statement: Select | TextClause) -> _Compiled | None:
    """None for a statement whose text depends on its parameters (an
    expanding IN list): SQLAlchemy runs those."""
    compiled = statement.compile(dialect=_ASYNCPG)
    if "POSTCOMPILE" in compiled.string or compiled.positiontup is None:
        return None
    return _Compiled(compiled.string, tuple(compiled.positiontup), dict(compiled.params))


async def fetch_all(
    conn: AsyncConnection, statement: Select | TextClause, params: Mapping[str, Any]
) -> Sequence[Sequence[Any]]:
    """Every row of ``statement`` (one built once and kept), each a sequence
    in the statement's column order (index it: asyncpg's records have no
    attributes). ``statement`` must be safe to run twice: a read, or one
    idempotent statement in autocommit (which, if it failed, did nothing)."""
    sync = conn.sync_connection
    if conn.dialect.driver == "asyncpg" and sync is not None and not (sync.closed or sync.invalidated):
        compiled = _compiled(statement)
        if compiled is not None:
            driver = sync.connection.driver_connection  # no I/O: the connection is open and valid
            args = [params[n] if n in params else compiled.literals[n] for n in compiled.names]
            try:
                return await driver.fetch(compiled.sql, *args)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001, S110 - SQLAlchemy tells it below
                # asyncpg's own exception: the same statement through
                # SQLAlchemy raises what a read raises elsewhere (and a dead
                # connection invalidates the pool, so the caller's retry
                # gets a fresh one), or succeeds if the fault has passed.
                pass
    return (await conn.execute(statement, dict(params))).all()
