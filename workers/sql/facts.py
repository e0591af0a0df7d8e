"""Facts in SQL: the I/O side of :mod:`memq.workers.memory.facts`.

Five tables (:mod:`memq.workers.sql.models`): generations, each fact as it
is now (``memq_facts``), every revision (``memq_fact_revisions``), the events
each fact came from (``memq_fact_sources``) and how far each session has been
derived into a generation (``memq_fact_cursors``). Facts are derived, like
the index: every row belongs to a generation, and a generation can be rebuilt
from the events SQL holds. Nothing here decides anything; the fact worker
(:mod:`memq.workers.facts.worker`) applies what the pure rules return, and
the query worker reads.

A session's facts and its cursor move in one transaction
(:func:`commit_batch`), so a worker killed mid-batch leaves either
everything or nothing of that batch, and the next one derives it again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson
from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from memq.contracts.ids import scope_key
from memq.workers.memory.facts import Change, Fact, fact_dict, fact_from_dict
from memq.workers.sql.engine import least
from memq.workers.sql.models import (
    EVENTS,
    FACT_CURSORS,
    FACT_GENERATIONS,
    FACT_REVISIONS,
    FACT_SOURCES,
    FACTS,
    SESSIONS,
)

FACT_TABLES = (FACTS, FACT_REVISIONS, FACT_SOURCES, FACT_CURSORS)


@dataclass(frozen=True)
class Generation:
    name: str
    fingerprint: str
    state: str  # building | live
    created_at: float


@dataclass(frozen=True)
class Revision:
    kind: str
    fact: Fact
    written_at: float


class CursorMoved(Exception):
    """Another replica derived this session meanwhile: the batch is dropped, not written twice."""


# --- generations --------------------------------------------------------------------


async def generations(conn: AsyncConnection) -> list[Generation]:
    rows = (await conn.execute(select(FACT_GENERATIONS).order_by(FACT_GENERATIONS.c.created_at))).all()
    return [Generation(r.name, r.fingerprint, r.state, r.created_at) for r in rows]


async def live_generation(conn: AsyncConnection) -> Generation | None:
    return next((g for g in await generations(conn) if g.state == "live"), None)


async def ensure_generation(conn: AsyncConnection, name: str, fingerprint: str) -> Generation:
    """The generation ``name``, created if absent: live when none is, else building."""
    known = {g.name: g for g in await generations(conn)}
    if name in known:
        return known[name]
    state = "building" if any(g.state == "live" for g in known.values()) else "live"
    made = Generation(name, fingerprint, state, time.time())
    await conn.execute(
        insert(FACT_GENERATIONS).values(name=name, fingerprint=fingerprint, state=state, created_at=made.created_at)
    )
    return made


async def promote(conn: AsyncConnection, name: str) -> list[str]:
    """Make ``name`` the live generation and drop every other (in the caller's
    transaction, so a read sees the old one or the new one, never neither);
    returns the names dropped."""
    others = [g.name for g in await generations(conn) if g.name != name]
    await conn.execute(update(FACT_GENERATIONS).where(FACT_GENERATIONS.c.name == name).values(state="live"))
    for other in others:
        await drop_generation(conn, other)
    return others


async def drop_generation(conn: AsyncConnection, name: str) -> None:
    for table in FACT_TABLES:
        await conn.execute(delete(table).where(table.c.generation == name))
    await conn.execute(delete(FACT_GENERATIONS).where(FACT_GENERATIONS.c.name == name))


# --- reading facts --------------------------------------------------------------------


async def user_facts(conn: AsyncConnection, generation: str, app: str, user: str) -> dict[str, Fact]:
    """Every fact about the user in ``generation``, current and invalidated, by id."""
    rows = await conn.execute(
        select(FACTS.c.data).where(FACTS.c.generation == generation, FACTS.c.user_key == scope_key(app, user))
    )
    facts = (fact_from_dict(orjson.loads(r.data)) for r in rows)
    return {f.id: f for f in facts}


async def revisions(conn: AsyncConnection, generation: str, fact_id: str) -> list[Revision]:
    """A fact's history, oldest first."""
    r = FACT_REVISIONS.c
    rows = await conn.execute(
        select(r.kind, r.data, r.written_at)
        .where(r.generation == generation, r.fact_id == fact_id)
        .order_by(r.revision)
    )
    return [Revision(row.kind, fact_from_dict(orjson.loads(row.data)), row.written_at) for row in rows]


async def cursor(conn: AsyncConnection, generation: str, session_key: str) -> int:
    c = FACT_CURSORS.c
    found = await conn.execute(select(c.up_to_seq).where(c.generation == generation, c.session_key == session_key))
    return int(found.scalar_one_or_none() or 0)


async def behind(conn: AsyncConnection, generation: str, app: str, user: str, min_seq: int | None = None) -> int:
    """How many of the user's sessions hold turns not derived yet (up to
    ``min_seq`` when given: a session counts if it has events at or below it
    beyond its cursor); 0 means the facts are current."""
    s, c = SESSIONS.c, FACT_CURSORS.c
    newest = s.last_seq if min_seq is None else least(conn.dialect.name, s.last_seq, min_seq)
    q = (
        select(func.count())
        .select_from(SESSIONS.outerjoin(FACT_CURSORS, and_(c.session_key == s.key, c.generation == generation)))
        .where(
            s.user_key == scope_key(app, user),
            s.last_seq > s.deleted_seq,
            newest > func.coalesce(c.up_to_seq, 0),
        )
    )
    return int((await conn.execute(q)).scalar_one())


async def pending_sessions(conn: AsyncConnection, generation: str, limit: int = 1000) -> list[tuple[str, str, str]]:
    """Visible sessions with events beyond their cursor: (app, user, session)."""
    s, c = SESSIONS.c, FACT_CURSORS.c
    q = (
        select(s.app, s.user_id, s.session_id)
        .select_from(SESSIONS.outerjoin(FACT_CURSORS, and_(c.session_key == s.key, c.generation == generation)))
        .where(s.last_seq > s.deleted_seq, s.last_seq > func.coalesce(c.up_to_seq, 0))
        .order_by(s.updated_at)
        .limit(limit)
    )
    return [(r.app, r.user_id, r.session_id) for r in await conn.execute(q)]


async def users_with_lost_sources(conn: AsyncConnection, generation: str) -> list[tuple[str, str]]:
    """Users with a fact citing an event SQL no longer holds (forgotten,
    deleted, expired): (app, user). One anti-join, for the sweep."""
    fs, f, e = FACT_SOURCES.c, FACTS.c, EVENTS.c
    q = (
        select(f.app, f.user_id)
        .distinct()
        .select_from(
            FACT_SOURCES.join(FACTS, and_(f.generation == fs.generation, f.fact_id == fs.fact_id)).outerjoin(
                EVENTS, and_(e.session_key == fs.session_key, e.event_id == fs.event_id)
            )
        )
        .where(fs.generation == generation, e.event_id.is_(None))
    )
    return [(r.app, r.user_id) for r in await conn.execute(q)]


async def lost_in_session(conn: AsyncConnection, generation: str, session_key: str) -> bool:
    """Whether a fact cites an event of the session that SQL no longer holds."""
    fs, e = FACT_SOURCES.c, EVENTS.c
    q = (
        select(fs.event_id)
        .select_from(FACT_SOURCES.outerjoin(EVENTS, and_(e.session_key == fs.session_key, e.event_id == fs.event_id)))
        .where(fs.generation == generation, fs.session_key == session_key, e.event_id.is_(None))
        .limit(1)
    )
    return (await conn.execute(q)).first() is not None


async def missing_sources(conn: AsyncConnection, facts: Iterable[Fact]) -> set[tuple[str, str]]:
    """The (session, event id) sources of ``facts`` (one user's) that SQL no longer holds."""
    wanted: dict[tuple[str, str], set[str]] = {}  # (session key, session id) -> event ids
    for fact in facts:
        for s in fact.sources:
            wanted.setdefault((scope_key(fact.app, fact.user, s.session), s.session), set()).add(s.event_id)
    missing: set[tuple[str, str]] = set()
    for (key, session), ids in wanted.items():
        held = await conn.execute(
            select(EVENTS.c.event_id).where(EVENTS.c.session_key == key, EVENTS.c.event_id.in_(sorted(ids)))
        )
        missing |= {(session, i) for i in ids - {r.event_id for r in held}}
    return missing


# --- writing --------------------------------------------------------------------------


async def commit_batch(
    conn: AsyncConnection,
    generation: str,
    changes: Sequence[Change],
    *,
    session_key: str | None = None,
    user_key: str | None = None,
    from_seq: int = 0,
    to_seq: int = 0,
) -> None:
    """Write ``changes`` and, given a session, move its cursor from
    ``from_seq`` to ``to_seq``, in the caller's transaction. Raises
    :class:`CursorMoved` (roll back) when the cursor is no longer at ``from_seq``."""
    if session_key is not None and user_key is not None:
        await _move_cursor(conn, generation, session_key, user_key, from_seq, to_seq)
    now = time.time()
    for change in changes:
        await _write(conn, generation, change, now)


async def _move_cursor(conn, generation: str, session_key: str, user_key: str, old: int, new: int) -> None:
    c = FACT_CURSORS.c
    if old == 0 and await cursor(conn, generation, session_key) == 0:
        # No row yet (or one at 0): insert; a replica racing us hits the primary key.
        await conn.execute(
            delete(FACT_CURSORS).where(c.generation == generation, c.session_key == session_key, c.up_to_seq == 0)
        )
        await conn.execute(
            insert(FACT_CURSORS).values(
                generation=generation, session_key=session_key, user_key=user_key, up_to_seq=new
            )
        )
        return
    moved = await conn.execute(
        update(FACT_CURSORS)
        .where(c.generation == generation, c.session_key == session_key, c.up_to_seq == old)
        .values(up_to_seq=new)
    )
    if moved.rowcount != 1:
        raise CursorMoved(f"the cursor of session {session_key[:12]} is no longer at {old}")


async def _write(conn, generation: str, change: Change, now: float) -> None:
    fact = change.fact
    where = and_(FACTS.c.generation == generation, FACTS.c.fact_id == fact.id)
    sources = and_(FACT_SOURCES.c.generation == generation, FACT_SOURCES.c.fact_id == fact.id)
    await conn.execute(delete(FACTS).where(where))
    await conn.execute(delete(FACT_SOURCES).where(sources))
    if change.kind == "removed":  # forgetting is erasure: its history goes too
        r = FACT_REVISIONS.c
        await conn.execute(delete(FACT_REVISIONS).where(r.generation == generation, r.fact_id == fact.id))
        return
    data = orjson.dumps(fact_dict(fact)).decode()
    await conn.execute(
        insert(FACTS).values(
            generation=generation,
            fact_id=fact.id,
            user_key=scope_key(fact.app, fact.user),
            app=fact.app,
            user_id=fact.user,
            revision=fact.revision,
            statement=fact.statement,
            valid_from=fact.valid_from,
            invalid_from=fact.invalid_from,
            data=data,
        )
    )
    await conn.execute(
        insert(FACT_SOURCES),
        [
            {
                "generation": generation,
                "fact_id": fact.id,
                "session_key": key,
                "event_id": event_id,
            }
            for key, event_id in sorted({(scope_key(fact.app, fact.user, s.session), s.event_id) for s in fact.sources})
        ],
    )
    await conn.execute(
        insert(FACT_REVISIONS).values(
            generation=generation, fact_id=fact.id, revision=fact.revision, kind=change.kind, data=data, written_at=now
        )
    )


async def rewrite_history(conn: AsyncConnection, generation: str, fact_id: str, log: Sequence[Revision]) -> None:
    """Replace a fact's revisions with ``log`` (after :func:`~memq.workers.memory.facts.scrub`)."""
    r = FACT_REVISIONS.c
    await conn.execute(delete(FACT_REVISIONS).where(r.generation == generation, r.fact_id == fact_id))
    for rev in log:
        await conn.execute(
            insert(FACT_REVISIONS).values(
                generation=generation,
                fact_id=fact_id,
                revision=rev.fact.revision,
                kind=rev.kind,
                data=orjson.dumps(fact_dict(rev.fact)).decode(),
                written_at=rev.written_at,
            )
        )


async def delete_user(conn: AsyncConnection, app: str, user: str) -> None:
    """Every fact, revision, source and cursor of the user, in every generation."""
    key = scope_key(app, user)
    ids = select(FACTS.c.fact_id).where(FACTS.c.user_key == key)
    for table in (FACT_REVISIONS, FACT_SOURCES):
        await conn.execute(delete(table).where(table.c.fact_id.in_(ids)))
    await conn.execute(delete(FACTS).where(FACTS.c.user_key == key))
    await conn.execute(delete(FACT_CURSORS).where(FACT_CURSORS.c.user_key == key))


async def delete_cursor(conn: AsyncConnection, session_key: str) -> None:
    await conn.execute(delete(FACT_CURSORS).where(FACT_CURSORS.c.session_key == session_key))
