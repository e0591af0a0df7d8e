"""Commits a batch of stream messages to SQL in one transaction.

The policy (which rows, which tombstones) is :mod:`memq.workers.memory.commit_plan`;
this module only talks to the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Select, and_, bindparam, case, delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from memq.workers.memory.commit_plan import (
    CommitPlan,
    Incoming,
    Scopes,
    Tombstones,
    collect_scopes,
    plan_commit,
    state_rows,
)
from memq.workers.sql.engine import dialect_name, greatest, insert_ignore, upsert_if_newer
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

SESSION_DATA = (EVENTS, SESSION_STATE, ARTIFACTS, CHECKPOINTS)  # rows that belong to one session


@dataclass
class CommitResult:
    plan: CommitPlan
    scopes: Scopes


def _chunks(rows: Sequence[dict], size: int):
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


class SqlStore:
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.dialect = dialect_name(engine)

    async def commit(self, items: Sequence[Incoming]) -> CommitResult:
        """Apply a batch atomically. Safe to repeat (redelivery) and to run
        concurrently with other replicas in any order."""
        scopes = collect_scopes(items)
        async with self.engine.begin() as conn:
            tombstones = await self._lock_scopes(conn, scopes)
            plan = plan_commit(items, tombstones)
            await self._apply_deletes(conn, plan)
            await self._insert(conn, plan)
            await self._touch_sessions(conn, plan)
        return CommitResult(plan, scopes)

    async def _lock_scopes(self, conn: AsyncConnection, scopes: Scopes) -> Tombstones:
        """Create missing user/session rows, then lock them (users first, in key
        order, so replicas cannot deadlock) and read their tombstones."""
        d = self.dialect
        users = sorted(scopes.users.items())
        sessions = sorted(scopes.sessions.items())
        if users:
            rows = [{"key": k, "app": u.app, "user_id": u.user, "deleted_seq": 0} for k, u in users]
            await conn.execute(insert_ignore(d, USERS), rows)
        if sessions:
            rows = [
                {
                    "key": k,
                    "user_key": s.user_key,
                    "app": s.app,
                    "user_id": s.user,
                    "session_id": s.session,
                    "last_seq": 0,
                    "deleted_seq": 0,
                    "created_at": 0.0,
                    "updated_at": 0.0,
                }
                for k, s in sessions
            ]
            await conn.execute(insert_ignore(d, SESSIONS), rows)
        user_tombs: dict[str, int] = {}
        session_tombs: dict[str, int] = {}
        if users:
            q = (
                select(USERS.c.key, USERS.c.deleted_seq)
                .where(USERS.c.key.in_([k for k, _ in users]))
                .order_by(USERS.c.key)
                .with_for_update()
            )
            user_tombs = dict((await conn.execute(q)).all())
        if sessions:
            q = (
                select(SESSIONS.c.key, SESSIONS.c.deleted_seq)
                .where(SESSIONS.c.key.in_([k for k, _ in sessions]))
                .order_by(SESSIONS.c.key)
                .with_for_update()
            )
            session_tombs = dict((await conn.execute(q)).all())
        return Tombstones(users=user_tombs, sessions=session_tombs)

    async def _apply_deletes(self, conn: AsyncConnection, plan: CommitPlan) -> None:
        d = self.dialect
        for user_key, seq in sorted(plan.user_deletes.items()):
            await conn.execute(
                update(USERS).where(USERS.c.key == user_key).values(deleted_seq=greatest(d, USERS.c.deleted_seq, seq))
            )
            await conn.execute(
                update(SESSIONS)
                .where(SESSIONS.c.user_key == user_key)
                .values(deleted_seq=greatest(d, SESSIONS.c.deleted_seq, seq))
            )
            await conn.execute(
                delete(USER_STATE).where(and_(USER_STATE.c.user_key == user_key, USER_STATE.c.seq < seq))
            )
            user_sessions = select(SESSIONS.c.key).where(SESSIONS.c.user_key == user_key)
            of_user: Select[str] | list[str] = user_sessions
            if d == "mysql":  # MySQL cannot delete with a subquery over a locked table
                of_user = [k for (k,) in (await conn.execute(user_sessions)).all()]
            for table in SESSION_DATA:
                await conn.execute(delete(table).where(and_(table.c.session_key.in_(of_user), table.c.seq < seq)))
        for session_key, seq in sorted(plan.session_deletes.items()):
            await conn.execute(
                update(SESSIONS)
                .where(SESSIONS.c.key == session_key)
                .values(deleted_seq=greatest(d, SESSIONS.c.deleted_seq, seq))
            )
            for table in SESSION_DATA:
                await conn.execute(delete(table).where(and_(table.c.session_key == session_key, table.c.seq < seq)))

    async def _insert(self, conn: AsyncConnection, plan: CommitPlan) -> None:
        d = self.dialect
        if plan.events:
            await conn.execute(insert_ignore(d, EVENTS), plan.events)
        for chunk in _chunks(plan.artifacts, 50):  # inline blobs can be large
            await conn.execute(insert_ignore(d, ARTIFACTS), chunk)
        if plan.checkpoints:
            await conn.execute(insert_ignore(d, CHECKPOINTS), plan.checkpoints)
        for table, writes, column in (
            (APP_STATE, plan.app_state, "app"),
            (USER_STATE, plan.user_state, "user_key"),
            (SESSION_STATE, plan.session_state, "session_key"),
        ):
            if rows := state_rows(writes, column):
                await conn.execute(upsert_if_newer(d, table), rows)

    async def _touch_sessions(self, conn: AsyncConnection, plan: CommitPlan) -> None:
        if not plan.touched:
            return
        d = self.dialect
        # created_at is set once, by the first commit that makes the session visible.
        stmt = (
            update(SESSIONS)
            .where(SESSIONS.c.key == bindparam("k"))
            .values(
                created_at=case((SESSIONS.c.created_at == 0, bindparam("t")), else_=SESSIONS.c.created_at),
                last_seq=greatest(d, SESSIONS.c.last_seq, bindparam("s")),
                updated_at=greatest(d, SESSIONS.c.updated_at, bindparam("t")),
            )
        )
        params = [{"k": k, "s": t.last_seq, "t": t.updated_at} for k, t in sorted(plan.touched.items())]
        await conn.execute(stmt, params)
