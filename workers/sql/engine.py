"""Async engines for PostgreSQL (asyncpg), SQLite (aiosqlite) and MySQL/MariaDB
(asyncmy), Alembic migrations, and the two dialect-specific upserts memq needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import ssl
import weakref
from collections.abc import AsyncIterator, Callable
from functools import cache
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Table, event, func, text
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

log = logging.getLogger("memq.sql")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_LOCK_ID = 0x6D656D71  # "memq": serialises migrations of replicas starting together


def create_engine(url: str, *, pool_size: int = 5, echo: bool = False) -> AsyncEngine:
    """An async engine for ``url``, with memq's pool and connection settings.

    :param url: a SQLAlchemy async URL (``postgresql+asyncpg``, ``sqlite+aiosqlite``,
        ``mysql+asyncmy``).
    :param pool_size: connections kept open (not for SQLite). Default 5.
    :param echo: log every statement. Default False.

    An in-memory SQLite URL gives every caller on the same event loop the same
    engine (the `inmemory` backend under `memq up`: the workers of one
    process share one database); it is closed by the last ``dispose()``.
    """
    u = make_url(url)
    if is_in_memory(u):
        return _shared_memory_engine(url, echo)
    kwargs: dict[str, Any] = {"echo": echo}
    if u.get_backend_name() == "sqlite" and u.database:
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"timeout": 30}
    else:
        # No pre-ping: on asyncpg it is three round trips (BEGIN, ";",
        # ROLLBACK) before every checkout, more than a cached read costs. A
        # connection found dead fails once with `connection_invalidated` set,
        # which also recycles the rest of the pool; callers retry that once
        # (see is_disconnect).
        kwargs.update(pool_size=pool_size, pool_recycle=1800)
        if u.get_backend_name() == "postgresql":
            u, ssl_arg = _asyncpg_tls(u)
            if ssl_arg is not None:
                kwargs["connect_args"] = {"ssl": ssl_arg}
    engine = create_async_engine(u, **kwargs)
    if u.get_backend_name() == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def reader(engine: AsyncEngine) -> AsyncEngine:
    """``engine`` for reads, sharing its pool: on PostgreSQL in autocommit,
    so a read is its statements alone, without BEGIN and ROLLBACK round trips
    around them. Each statement then sees its own snapshot: a read of several
    statements may see a commit between them (only ever newer data).
    (SQLite's BEGIN costs no round trip; MySQL's autocommit switch costs two.)"""
    if dialect_name(engine) == "postgresql":
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine


def is_disconnect(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection found dead (the server restarted, a
    proxy closed it): SQLAlchemy has then invalidated the pool's older
    connections, and the same work on a fresh one may succeed."""
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def is_in_memory(url: str | URL) -> bool:
    """Whether ``url`` is an in-memory SQLite database (the `inmemory` backend)."""
    u = make_url(url)
    return u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:")


class _SharedEngine(AsyncEngine):
    """An engine handed to several owners, each of which disposes it once:
    only the last ``dispose()`` closes it (and with it the in-memory database)."""

    __slots__ = ("owners", "release")
    owners: int
    release: Callable[[], object]

    async def dispose(self, close: bool = True) -> None:
        self.owners -= 1
        if self.owners <= 0:
            self.release()
            await super().dispose(close)


# Per event loop (aiosqlite and the pool's queue belong to one loop), per URL.
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _SharedEngine]] = weakref.WeakKeyDictionary()


def _shared_memory_engine(url: str, echo: bool) -> AsyncEngine:
    """The in-memory SQLite engine of this event loop, made on first use.

    An in-memory database lives in one connection, so the pool holds exactly
    one (pool_size 1, no overflow): callers wait for it in turn, each with
    its own transaction. (StaticPool would hand the same connection to
    concurrent callers, whose commits and rollbacks would then mix.)
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop yet: nothing to share with
        loop = None
    engines = _SHARED.setdefault(loop, {}) if loop is not None else {}
    engine = engines.get(url)
    if engine is None:
        sync_engine = create_async_engine(
            url,
            echo=echo,
            poolclass=AsyncAdaptedQueuePool,
            pool_size=1,
            max_overflow=0,
            pool_timeout=120,  # a long write batch holds the one connection
            connect_args={"check_same_thread": False},
        ).sync_engine
        engine = _SharedEngine(sync_engine)
        engine.owners = 0
        engine.release = lambda: engines.pop(url, None)
        engines[url] = engine
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    engine.owners += 1
    return engine


_LIBPQ_TLS = ("sslmode", "sslrootcert", "sslcert", "sslkey")


def _last(value: str | tuple[str, ...]) -> str:
    """A URL parameter given more than once: the last one wins, as in a libpq DSN."""
    return value if isinstance(value, str) else value[-1]


def _asyncpg_tls(u: URL) -> tuple[URL, ssl.SSLContext | str | None]:
    """libpq's TLS URL parameters as asyncpg's ``ssl`` argument: asyncpg reads
    them only from a DSN, and SQLAlchemy hands it keywords instead.

    ``verify-full`` checks the chain and the host name, ``verify-ca`` the
    chain only; other modes (``require``, ``prefer``…) pass through as is.
    """
    params = {k: _last(u.query[k]) for k in _LIBPQ_TLS if k in u.query}
    if not params:
        return u, None
    u = u.difference_update_query(_LIBPQ_TLS)
    mode = params.get("sslmode", "verify-full" if "sslrootcert" in params else "prefer")
    if mode not in ("verify-ca", "verify-full"):
        return u, mode
    ctx = ssl.create_default_context(cafile=params.get("sslrootcert"))
    ctx.check_hostname = mode == "verify-full"
    if "sslcert" in params:
        ctx.load_cert_chain(params["sslcert"], params.get("sslkey"))
    return u, ctx


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers (memq demo) beside the writer
    cur.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def dialect_name(conn: Connection | AsyncConnection | AsyncEngine) -> str:
    name = conn.dialect.name
    return "mysql" if name in ("mysql", "mariadb") else name


def _alembic_config(sync_conn: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = sync_conn
    return cfg


def _upgrade(sync_conn: Connection) -> None:
    dialect = dialect_name(sync_conn)
    if dialect == "postgresql":
        sync_conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
    elif dialect == "mysql":
        sync_conn.execute(text("SELECT GET_LOCK('memq_migrate', 60)"))
    try:
        command.upgrade(_alembic_config(sync_conn), "head")
    finally:
        if dialect == "mysql":
            sync_conn.execute(text("SELECT RELEASE_LOCK('memq_migrate')"))


async def migrate(engine: AsyncEngine) -> None:
    """Bring the schema to the newest revision (safe with replicas starting at once)."""
    async with _sqlite_file_lock(engine):
        async with engine.begin() as conn:
            await conn.run_sync(_upgrade)


@contextlib.asynccontextmanager
async def _sqlite_file_lock(engine: AsyncEngine) -> AsyncIterator[None]:
    """For a SQLite file, an exclusive flock on ``<database>.migrate.lock``:
    SQLite has no advisory lock, and two `memq worker` processes migrating a
    fresh file at once fail with "table ... already exists". flock (not
    lockf) also separates engines of one process; it is taken in a thread
    so that a waiting engine does not block the one holding it."""
    u = engine.url
    if u.get_backend_name() != "sqlite" or is_in_memory(u):
        yield
        return
    fd = os.open(f"{u.database}.migrate.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _current(sync_conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(sync_conn).get_current_revision()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(_current)


# --- dialect-specific statements -------------------------------------------


def _insert(dialect: str, table: Table):
    return {"postgresql": postgresql.insert, "sqlite": sqlite.insert, "mysql": mysql.insert}[dialect](table)


# The statements take their rows at execute time (``conn.execute(stmt, rows)``):
# SQLAlchemy then compiles each once and batches the rows itself
# ("insertmanyvalues"), instead of compiling a new multi-row VALUES per batch,
# which cost ~40 % of the worker's CPU.


@cache
def insert_ignore(dialect: str, table: Table):
    """INSERT that skips rows whose primary key exists (idempotent inserts)."""
    stmt = _insert(dialect, table)
    if dialect == "mysql":
        # A no-op update rather than INSERT IGNORE, which would also hide data errors.
        first_pk = next(iter(table.primary_key.columns))
        return stmt.on_duplicate_key_update({first_pk.name: first_pk})
    return stmt.on_conflict_do_nothing()


@cache
def upsert_if_newer(dialect: str, table: Table, value: str = "value"):
    """INSERT, or UPDATE ``value`` and ``seq`` only where the incoming seq is newer.

    This makes state writes commute: whatever order replicas commit in, each
    key ends with the value of the highest stream sequence (= stream order).
    """
    stmt = _insert(dialect, table)
    if dialect == "mysql":
        new = stmt.inserted
        # Order matters in MySQL: ``value`` must be compared before ``seq`` changes.
        return stmt.on_duplicate_key_update(
            [
                (value, func.if_(table.c.seq < new.seq, new[value], table.c[value])),
                ("seq", func.greatest(table.c.seq, new.seq)),
            ]
        )
    new = stmt.excluded
    pk = [c.name for c in table.primary_key.columns]
    return stmt.on_conflict_do_update(
        index_elements=pk,
        set_={value: new[value], "seq": new.seq},
        where=table.c.seq < new.seq,
    )


def greatest(dialect: str, a, b):
    return func.max(a, b) if dialect == "sqlite" else func.greatest(a, b)


def least(dialect: str, a, b):
    return func.min(a, b) if dialect == "sqlite" else func.least(a, b)
