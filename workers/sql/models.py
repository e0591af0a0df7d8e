"""The SQL schema (the source of truth), as SQLModel tables.

Sessions and users are keyed by a sha256 digest of their ids
(:func:`memq.contracts.ids.scope_key`): three 256-byte id columns would exceed
MySQL's 3072-byte index limit. Every row carries ``seq``, the stream sequence
of the message that wrote it, which is what makes commits from several
replicas order-independent (a write wins only over older sequences) and lets a
delete tombstone (``deleted_seq``) drop late writes from before the delete.
Schema changes go through Alembic (``workers/sql/migrations``).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Index, LargeBinary, String, Table, Text
from sqlalchemy.dialects import mysql
from sqlmodel import Field, SQLModel


# Case- and accent-sensitive comparison on MySQL/MariaDB, whose default
# collations would make the ids "A" and "a" collide.
def Id(length: int = 256) -> String:  # noqa: N802 - reads like a type
    return String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def Digest() -> String:  # noqa: N802
    return String(64).with_variant(mysql.CHAR(64, charset="ascii", collation="ascii_bin"), "mysql", "mariadb")


def LongText() -> Text:  # noqa: N802 - MySQL TEXT stops at 64 KiB
    return Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def Blob() -> LargeBinary:  # noqa: N802
    return LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def Seconds() -> Float:  # noqa: N802
    # MySQL's FLOAT is single precision: unix seconds would round to 128 s.
    # (PostgreSQL's FLOAT and SQLite's REAL are double precision already.)
    return Float().with_variant(mysql.DOUBLE(asdecimal=False), "mysql", "mariadb")


def Time(**kw) -> Column:  # noqa: N802
    return Column(Seconds(), nullable=False, default=0.0, **kw)


def Seq(**kw) -> Column:  # noqa: N802
    return Column(BigInteger, nullable=False, **kw)


class User(SQLModel, table=True):
    __tablename__ = "memq_users"

    key: str = Field(sa_column=Column(Digest(), primary_key=True))
    app: str = Field(sa_column=Column(Id(), nullable=False))
    user_id: str = Field(sa_column=Column(Id(), nullable=False))
    deleted_seq: int = Field(default=0, sa_column=Seq(default=0))


class Session(SQLModel, table=True):
    __tablename__ = "memq_sessions"
    # Keyset pages, newest update first, per app or per user: an index range
    # scan whatever the number of sessions.
    __table_args__ = (
        Index("ix_memq_sessions_app_updated", "app", "updated_at", "key"),
        Index("ix_memq_sessions_user_updated", "user_key", "updated_at", "key"),
    )

    key: str = Field(sa_column=Column(Digest(), primary_key=True))
    user_key: str = Field(sa_column=Column(Digest(), nullable=False))
    app: str = Field(sa_column=Column(Id(), nullable=False))
    user_id: str = Field(sa_column=Column(Id(), nullable=False))
    session_id: str = Field(sa_column=Column(Id(), nullable=False))
    # Visible while last_seq > deleted_seq; a row with last_seq 0 is only a lock.
    last_seq: int = Field(default=0, sa_column=Seq(default=0))
    deleted_seq: int = Field(default=0, sa_column=Seq(default=0))
    created_at: float = Field(default=0.0, sa_column=Time())
    # ADK's last_update_time: the timestamp of the newest event in stream order
    # (or of the creation), the message at updated_seq; see commit_plan.Touch.
    updated_at: float = Field(default=0.0, sa_column=Time())
    updated_seq: int = Field(default=0, sa_column=Seq(default=0, server_default="0"))
    # The newest forget of one of its events (0: none): a window cached
    # before it is read afresh (see memq.workers.sql.window).
    forgot_seq: int = Field(default=0, sa_column=Seq(default=0, server_default="0"))


class Event(SQLModel, table=True):
    __tablename__ = "memq_events"
    __table_args__ = (
        Index("ix_memq_events_session_seq", "session_key", "seq", unique=True),
        # For filters by time ("the last 24 hours"): a planner with statistics
        # reads the few recent events of a long session as a range.
        Index("ix_memq_events_session_time", "session_key", "timestamp"),
    )

    session_key: str = Field(sa_column=Column(Digest(), primary_key=True))
    event_id: str = Field(sa_column=Column(Id(), primary_key=True))
    seq: int = Field(sa_column=Seq())
    invocation_id: str = Field(default="", sa_column=Column(Id(), nullable=False, default=""))
    author: str = Field(default="", sa_column=Column(Id(), nullable=False, default=""))
    branch: str = Field(default="", sa_column=Column(Text(), nullable=False, default=""))
    role: str | None = Field(default=None, max_length=16)
    timestamp: float = Field(default=0.0, sa_column=Time())
    # Tokens as one chat message (tiktoken, counted once at persist time).
    tokens: int = Field(default=0)
    # The whole event as JSON, exactly as published.
    data: str = Field(sa_column=Column(LongText(), nullable=False))


class AppState(SQLModel, table=True):
    __tablename__ = "memq_app_state"

    app: str = Field(sa_column=Column(Id(), primary_key=True))
    key: str = Field(sa_column=Column(Id(), primary_key=True))
    value: str = Field(sa_column=Column(LongText(), nullable=False))
    seq: int = Field(sa_column=Seq())


class UserState(SQLModel, table=True):
    __tablename__ = "memq_user_state"

    user_key: str = Field(sa_column=Column(Digest(), primary_key=True))
    key: str = Field(sa_column=Column(Id(), primary_key=True))
    value: str = Field(sa_column=Column(LongText(), nullable=False))
    seq: int = Field(sa_column=Seq())


class SessionState(SQLModel, table=True):
    __tablename__ = "memq_session_state"

    session_key: str = Field(sa_column=Column(Digest(), primary_key=True))
    key: str = Field(sa_column=Column(Id(), primary_key=True))
    value: str = Field(sa_column=Column(LongText(), nullable=False))
    seq: int = Field(sa_column=Seq())


class Artifact(SQLModel, table=True):
    """One version of an artifact; versions are numbered by ``seq`` order."""

    __tablename__ = "memq_artifacts"
    __table_args__ = (Index("ix_memq_artifacts_file", "session_key", "filename", "seq"),)

    session_key: str = Field(sa_column=Column(Digest(), primary_key=True))
    artifact_id: str = Field(sa_column=Column(Id(), primary_key=True))
    filename: str = Field(sa_column=Column(Id(), nullable=False))
    seq: int = Field(sa_column=Seq())
    mime_type: str = Field(default="application/octet-stream", max_length=255)
    size: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    sha256: str = Field(sa_column=Column(Digest(), nullable=False))
    inline: bytes | None = Field(default=None, sa_column=Column(Blob(), nullable=True))
    object_bucket: str | None = Field(default=None, max_length=64)
    object_name: str | None = Field(default=None, sa_column=Column(Text(), nullable=True))
    created_at: float = Field(default=0.0, sa_column=Time())


class Checkpoint(SQLModel, table=True):
    """A summary of a session up to ``up_to_seq``; the latest one is found by
    an index seek on (session_key, up_to_seq), never by scanning the session."""

    __tablename__ = "memq_checkpoints"
    __table_args__ = (Index("ix_memq_checkpoints_latest", "session_key", "up_to_seq", "seq"),)

    session_key: str = Field(sa_column=Column(Digest(), primary_key=True))
    checkpoint_id: str = Field(sa_column=Column(Id(), primary_key=True))
    seq: int = Field(sa_column=Seq())
    up_to_seq: int = Field(sa_column=Seq())
    summary: str = Field(sa_column=Column(LongText(), nullable=False))
    tokens: int = Field(default=0)
    author: str = Field(default="", sa_column=Column(Id(), nullable=False, default=""))
    created_at: float = Field(default=0.0, sa_column=Time())


# --- facts (derived, like the index: rebuilt from the events into generations) ---


class FactGeneration(SQLModel, table=True):
    """A set of facts derived with one model and prompt (``fingerprint``);
    reads use the one ``live``, a changed model or prompt fills a ``building`` one."""

    __tablename__ = "memq_fact_generations"

    name: str = Field(sa_column=Column(Id(64), primary_key=True))
    fingerprint: str = Field(sa_column=Column(Text(), nullable=False))
    state: str = Field(sa_column=Column(String(16), nullable=False))  # building | live
    created_at: float = Field(default=0.0, sa_column=Time())


class FactRow(SQLModel, table=True):
    """A fact as it is now (its newest revision); its history is in memq_fact_revisions."""

    __tablename__ = "memq_facts"
    __table_args__ = (Index("ix_memq_facts_user", "generation", "user_key"),)

    generation: str = Field(sa_column=Column(Id(64), primary_key=True))
    fact_id: str = Field(sa_column=Column(String(32), primary_key=True))
    user_key: str = Field(sa_column=Column(Digest(), nullable=False))
    app: str = Field(sa_column=Column(Id(), nullable=False))
    user_id: str = Field(sa_column=Column(Id(), nullable=False))
    revision: int = Field(default=1)
    statement: str = Field(sa_column=Column(LongText(), nullable=False))
    valid_from: float = Field(default=0.0, sa_column=Time())
    invalid_from: float | None = Field(default=None, sa_column=Column(Seconds(), nullable=True))
    # The whole fact (entities, sources, interval) as JSON.
    data: str = Field(sa_column=Column(LongText(), nullable=False))


class FactRevision(SQLModel, table=True):
    """Every revision of every fact, kept: nothing is overwritten in place."""

    __tablename__ = "memq_fact_revisions"

    generation: str = Field(sa_column=Column(Id(64), primary_key=True))
    fact_id: str = Field(sa_column=Column(String(32), primary_key=True))
    revision: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    kind: str = Field(sa_column=Column(String(16), nullable=False))
    data: str = Field(sa_column=Column(LongText(), nullable=False))
    written_at: float = Field(default=0.0, sa_column=Time())


class FactSource(SQLModel, table=True):
    """The events a fact came from, one row each: a forgotten or deleted event
    is found by one anti-join with memq_events, not by reading every fact."""

    __tablename__ = "memq_fact_sources"
    __table_args__ = (Index("ix_memq_fact_sources_event", "session_key", "event_id"),)

    generation: str = Field(sa_column=Column(Id(64), primary_key=True))
    fact_id: str = Field(sa_column=Column(String(32), primary_key=True))
    session_key: str = Field(sa_column=Column(Digest(), primary_key=True))
    event_id: str = Field(sa_column=Column(Id(), primary_key=True))


class FactCursor(SQLModel, table=True):
    """How far a session's events have been derived into a generation."""

    __tablename__ = "memq_fact_cursors"
    __table_args__ = (Index("ix_memq_fact_cursors_user", "generation", "user_key"),)

    generation: str = Field(sa_column=Column(Id(64), primary_key=True))
    session_key: str = Field(sa_column=Column(Digest(), primary_key=True))
    user_key: str = Field(sa_column=Column(Digest(), nullable=False))
    up_to_seq: int = Field(default=0, sa_column=Seq(default=0))


metadata = SQLModel.metadata
TABLES = (
    User,
    Session,
    Event,
    AppState,
    UserState,
    SessionState,
    Artifact,
    Checkpoint,
    FactGeneration,
    FactRow,
    FactRevision,
    FactSource,
    FactCursor,
)


def table_of(model: type[SQLModel]) -> Table:
    """The Core table behind a model, for queries written in SQLAlchemy Core."""
    # SQLModel's metaclass sets __table__ on every table=True model, but the
    # class does not declare it for type checkers.
    return model.__table__  # type: ignore[attr-defined]


# The Core tables, named once for the reads (sql/reads.py) and the commits
# (persistence/store.py).
USERS = table_of(User)
SESSIONS = table_of(Session)
EVENTS = table_of(Event)
APP_STATE = table_of(AppState)
USER_STATE = table_of(UserState)
SESSION_STATE = table_of(SessionState)
ARTIFACTS = table_of(Artifact)
CHECKPOINTS = table_of(Checkpoint)
FACT_GENERATIONS = table_of(FactGeneration)
FACTS = table_of(FactRow)
FACT_REVISIONS = table_of(FactRevision)
FACT_SOURCES = table_of(FactSource)
FACT_CURSORS = table_of(FactCursor)
