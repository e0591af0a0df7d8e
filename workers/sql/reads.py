"""Read side of the SQL store: what a session holds, in stream order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.ids import scope_key
from workers.memory.state import merge_state
from workers.sql import models

SESSIONS = models.Session.__table__
EVENTS = models.Event.__table__


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    event_id: str
    author: str
    role: str | None
    timestamp: float
    data: dict[str, Any]


async def session_exists(engine: AsyncEngine, app: str, user: str, session: str) -> bool:
    q = select(SESSIONS.c.last_seq > SESSIONS.c.deleted_seq).where(SESSIONS.c.key == scope_key(app, user, session))
    async with engine.connect() as conn:
        return bool((await conn.execute(q)).scalar())


async def count_events(engine: AsyncEngine, app: str, user: str, session: str) -> int:
    q = select(func.count()).select_from(EVENTS).where(EVENTS.c.session_key == scope_key(app, user, session))
    async with engine.connect() as conn:
        return int((await conn.execute(q)).scalar_one())


async def events(engine: AsyncEngine, app: str, user: str, session: str) -> list[StoredEvent]:
    q = (
        select(EVENTS.c.seq, EVENTS.c.event_id, EVENTS.c.author, EVENTS.c.role, EVENTS.c.timestamp, EVENTS.c.data)
        .where(EVENTS.c.session_key == scope_key(app, user, session))
        .order_by(EVENTS.c.seq)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    return [StoredEvent(r.seq, r.event_id, r.author, r.role, r.timestamp, orjson.loads(r.data)) for r in rows]


async def state(engine: AsyncEngine, app: str, user: str, session: str | None = None) -> dict[str, Any]:
    """Merged state as ADK shows it (``app:`` and ``user:`` keys prefixed)."""
    async with engine.connect() as conn:
        app_rows = await conn.execute(
            select(models.AppState.key, models.AppState.value).where(models.AppState.app == app)
        )
        user_rows = await conn.execute(
            select(models.UserState.key, models.UserState.value).where(
                models.UserState.user_key == scope_key(app, user)
            )
        )
        session_rows = []
        if session is not None:
            session_rows = await conn.execute(
                select(models.SessionState.key, models.SessionState.value).where(
                    models.SessionState.session_key == scope_key(app, user, session)
                )
            )
        decode = lambda rows: {k: orjson.loads(v) for k, v in rows}  # noqa: E731
        return merge_state(decode(app_rows), decode(user_rows), decode(session_rows))
