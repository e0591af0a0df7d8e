"""Commits a batch of stream messages to SQL in one transaction.

The policy (which rows, which tombstones) is :mod:`memq.workers.memory.commit_plan`;
this module only talks to the database.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby

from sqlalchemy import BigInteger, Select, and_, bindparam, case, delete, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from memq.contracts.schemas import SessionDeleted, UserDeleted
from memq.workers.memory.commit_plan import (
    CommitPlan,
    EventKey,
    Incoming,
    Scopes,
    SessionRef,
    Tombstones,
    Touch,
    collect_scopes,
    keys_of,
    plan_commit,
    state_rows,
)
from memq.workers.persistence import pg_bulk
from memq.workers.sql.engine import dialect_name, greatest, insert_ignore, reader, upsert_if_newer
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


class StaleTombstones(Exception):
    """A session's tombstone, guessed before the user locks were granted,
    turned out older than the stored one: the transaction is rolled back and
    the batch committed again, reading the tombstones after the locks."""


@dataclass
class CommitResult:
    plan: CommitPlan
    scopes: Scopes


def _user_rows(scopes: Scopes, keys: Sequence[str]) -> list[dict]:
    return [{"key": k, "app": scopes.users[k].app, "user_id": scopes.users[k].user, "deleted_seq": 0} for k in keys]


def _session_row(key: str, s: SessionRef) -> dict:
    return {
        "key": key,
        "user_key": s.user_key,
        "app": s.app,
        "user_id": s.user,
        "session_id": s.session,
        "last_seq": 0,
        "updated_seq": 0,
        "deleted_seq": 0,
        "created_at": 0.0,
        "updated_at": 0.0,
    }


def deleting_users(items: Iterable[Incoming]) -> set[str]:
    """Users whose tombstones a batch writes (it deletes one of their sessions,
    or them): the rows it locks FOR UPDATE."""
    return {keys_of(i.message)[0] for i in items if isinstance(i.message, (SessionDeleted, UserDeleted))}


def _writes_more_than_events(plan: CommitPlan) -> bool:
    deletes = (plan.user_deletes, plan.session_deletes, plan.forgets)
    return any((plan.artifacts, plan.checkpoints, plan.app_state, plan.user_state, plan.session_state, *deletes))


def _chunks(rows: Sequence[dict], size: int):
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


class SqlStore:
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.dialect = dialect_name(engine)
        # MySQL's default REPEATABLE READ would read the tombstones from a
        # snapshot older than the user locks; PostgreSQL's default is this one.
        self._writer = engine.execution_options(isolation_level="READ COMMITTED") if self.dialect == "mysql" else engine
        # PostgreSQL: a batch that only appends is one statement, in autocommit
        # (the reads' engine: no BEGIN or COMMIT round trip around it).
        self._autocommit = reader(engine)

    async def commit(self, items: Sequence[Incoming], tokens: Mapping[int, int] | None = None) -> CommitResult:
        """Apply a batch atomically. Safe to repeat (redelivery) and to run
        concurrently with other replicas in any order. ``tokens``: the
        events' counts by seq, where the caller counted them already
        (:func:`~memq.workers.memory.commit_plan.event_tokens`)."""
        scopes = collect_scopes(items)
        deleting = deleting_users(items)
        if (
            self.dialect == "postgresql"
            and not deleting
            and (done := await self._append_only(items, scopes, tokens=tokens))
        ):
            return done
        # On PostgreSQL a batch that deletes nothing (the common one) reads the
        # session tombstones in the statement that takes the user locks, and
        # checks them as it touches the sessions: two round trips fewer.
        if self.dialect == "postgresql" and not deleting:
            try:
                return await self._commit(items, scopes, deleting, guess=True, tokens=tokens)
            except StaleTombstones:  # a delete committed while the locks were awaited: rare
                pass
        return await self._commit(items, scopes, deleting, guess=False, tokens=tokens)

    async def stored_events(self, keys: Collection[EventKey]) -> dict[EventKey, tuple[int, str]]:
        """(seq, data) of the stored events among ``keys``, for
        :func:`~memq.workers.memory.commit_plan.reused_event_ids`: a seek per
        key on the primary key: on PostgreSQL a join with the pairs as arrays
        (:func:`pg_bulk.stored_events`), elsewhere a row-value ``IN`` in
        chunks that stay under SQLite's bound-parameter limit. The pairs are
        matched as pairs: two separate ``IN`` lists, of sessions and of ids,
        had the database read every event of the batch's sessions, a cost
        that grew with their length (at 64 agents most of PostgreSQL's CPU
        per turn)."""
        found: dict[EventKey, tuple[int, str]] = {}
        wanted = sorted(set(keys))
        c = EVENTS.c
        async with self._autocommit.connect() as conn:
            if self.dialect == "postgresql":
                return await pg_bulk.stored_events(conn, EVENTS, wanted)
            for start in range(0, len(wanted), 400):
                chunk = wanted[start : start + 400]
                q = select(c.session_key, c.event_id, c.seq, c.data).where(tuple_(c.session_key, c.event_id).in_(chunk))
                for key, event_id, seq, data in (await conn.execute(q)).all():
                    found[(key, event_id)] = (seq, data)
        return found

    async def _append_only(
        self, items: Sequence[Incoming], scopes: Scopes, *, tokens: Mapping[int, int] | None = None
    ) -> CommitResult | None:
        """The commit of a batch of events only (no state, artifact, summary or
        delete) to sessions that all exist, the agent's usual one: one
        statement, one round trip (:func:`pg_bulk.append_only`), instead of
        BEGIN, the user locks, the insert and COMMIT. It takes no user lock:
        the session rows it locks are what a delete updates too. None when
        the batch is not such a batch; then nothing was written that the full
        commit does not repeat."""
        plan = plan_commit(items, Tombstones(users={}, sessions={}), tokens)
        if not plan.events or len(plan.events) != len(items) or _writes_more_than_events(plan):
            return None
        async with self._autocommit.connect() as conn:
            kept = await pg_bulk.append_only(conn, EVENTS, SESSIONS, USERS, plan.events, list(plan.touched))
        if kept is None:
            return None
        if len(kept) < len(plan.events):  # some were older than a delete: as plan_commit would have it
            plan.dropped = sorted(e["seq"] for e in plan.events if e["seq"] not in kept)
            plan.events = [e for e in plan.events if e["seq"] in kept]
            plan.touched = {}
            for e in plan.events:
                if (touch := plan.touched.get(e["session_key"])) is None:
                    plan.touched[e["session_key"]] = Touch.first(e["seq"], e["timestamp"], updates=True)
                else:
                    touch.add(e["seq"], e["timestamp"], updates=True)
        return CommitResult(plan, scopes)

    async def _commit(
        self,
        items: Sequence[Incoming],
        scopes: Scopes,
        deleting: Collection[str],
        *,
        guess: bool,
        tokens: Mapping[int, int] | None = None,
    ) -> CommitResult:
        async with self._writer.begin() as conn:
            tombstones = await self._lock_scopes(conn, scopes, deleting, guess)
            plan = plan_commit(items, tombstones, tokens)
            await self._apply_deletes(conn, plan)
            await self._insert(conn, plan)
            await self._touch_sessions(conn, plan, tombstones if guess else None)
        return CommitResult(plan, scopes)

    async def _lock_scopes(
        self, conn: AsyncConnection, scopes: Scopes, deleting: Collection[str] = frozenset(), guess: bool = False
    ) -> Tombstones:
        """Read the tombstones of the batch's users and sessions, creating rows
        that are missing, under the one lock stream order needs: the user row.

        Every tombstone is written under its user's row locked FOR UPDATE (a
        batch that deletes a session or user, ``deleting``); every other batch
        reads the tombstones under its users' rows locked FOR SHARE, which do
        not block each other. So commits of one user's sessions run side by
        side, while a delete still waits for the commits in flight and they for
        it. Session rows take no lock here: the commit's last step updates
        them, so they are held only from there to the commit. Users are locked
        in key order (runs of one mode), so replicas cannot deadlock. On SQLite
        (one writer at a time) the locking clauses are no-ops.

        With ``guess`` (PostgreSQL, nothing in ``deleting``), the session
        tombstones are read in the statement that locks the users, from a
        snapshot taken before the locks were granted: they may miss a delete
        that committed meanwhile, so :meth:`_touch_sessions` checks them.
        """
        users = sorted(scopes.users)
        if self.dialect == "sqlite" and users:
            # SQLite begins the transaction at its first write: write first, so
            # the database's one write lock is held before any tombstone is read.
            await conn.execute(insert_ignore(self.dialect, USERS), _user_rows(scopes, users))
        session_tombs: dict[str, int] | None = None
        if guess:
            user_tombs, session_tombs = await pg_bulk.share_users_read_sessions(
                conn, USERS, SESSIONS, users, sorted(scopes.sessions)
            )
        else:
            user_tombs = await self._lock_users(conn, users, deleting)
        if missing := [k for k in users if k not in user_tombs]:
            await conn.execute(insert_ignore(self.dialect, USERS), _user_rows(scopes, missing))
            user_tombs.update(await self._lock_users(conn, missing, deleting))
        # Read after the user locks: a delete of these sessions committed
        # before them is seen (READ COMMITTED), one after them waits for us.
        # Only missing rows are inserted: MySQL's insert-ignore locks the rows it skips.
        if session_tombs is None:
            session_tombs = {}
        if scopes.sessions and not guess:
            q = select(SESSIONS.c.key, SESSIONS.c.deleted_seq).where(SESSIONS.c.key.in_(sorted(scopes.sessions)))
            session_tombs = dict((await conn.execute(q)).all())
        if missing_sessions := sorted(k for k in scopes.sessions if k not in session_tombs):
            rows = [_session_row(k, scopes.sessions[k]) for k in missing_sessions]
            await conn.execute(insert_ignore(self.dialect, SESSIONS), rows)
            # New, or created by a batch that committed meanwhile: never deleted,
            # since a delete would need the user lock this batch holds.
            session_tombs.update(dict.fromkeys(missing_sessions, 0))
        return Tombstones(users=user_tombs, sessions=session_tombs)

    async def _lock_users(
        self, conn: AsyncConnection, keys: Sequence[str], deleting: Collection[str]
    ) -> dict[str, int]:
        """Lock the existing user rows among ``keys`` (sorted): FOR UPDATE those
        in ``deleting``, FOR SHARE the others; their tombstones."""
        tombs: dict[str, int] = {}
        for exclusive, run in groupby(keys, key=lambda k: k in deleting):
            q = (
                select(USERS.c.key, USERS.c.deleted_seq)
                .where(USERS.c.key.in_(list(run)))
                .order_by(USERS.c.key)
                .with_for_update(read=not exclusive)
            )
            tombs.update((await conn.execute(q)).all())
        return tombs

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
        for session_key, forgotten in sorted(plan.forgets.items()):
            # By session and seq: a seq of another session's event matches no row here.
            e = EVENTS.c
            await conn.execute(delete(EVENTS).where(and_(e.session_key == session_key, e.seq.in_(sorted(forgotten)))))
            # forgot_seq moves even when no row was there: a cached window is
            # compared on it. last_seq moves too (what a caller's expect_seq is
            # read from), but only for a visible session: a forget starts none.
            newest, s = max(forgotten.values()), SESSIONS.c
            await conn.execute(
                update(SESSIONS)
                .where(s.key == session_key)
                .ordered_values(
                    (s.last_seq, case((s.last_seq > s.deleted_seq, greatest(d, s.last_seq, newest)), else_=s.last_seq)),
                    (s.forgot_seq, greatest(d, s.forgot_seq, newest)),
                )
            )

    async def _insert(self, conn: AsyncConnection, plan: CommitPlan) -> None:
        d = self.dialect
        if d == "postgresql":
            pass  # in the statement that touches the sessions: _touch_sessions
        elif plan.events:
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

    async def _touch_sessions(self, conn: AsyncConnection, plan: CommitPlan, guessed: Tombstones | None = None) -> None:
        """Make the touched sessions newer. On PostgreSQL the same statement
        inserts the batch's events (one for all of them), and tombstones
        ``guessed`` before the locks are checked against the stored ones."""
        d = self.dialect
        if d == "postgresql":
            touched = [(k, t.last_seq, t.updated_seq, t.updated_at) for k, t in sorted(plan.touched.items())]
            stored = await pg_bulk.touch_sessions(conn, SESSIONS, touched, insert_into=EVENTS, rows=plan.events)
            # Every session the batch writes to is touched, so this covers each
            # tombstone the plan relied on; the user tombstones were read locked.
            if guessed is not None and any(stored.get(k) != guessed.sessions.get(k, 0) for k, *_ in touched):
                raise StaleTombstones
            return
        if not plan.touched:
            return
        # created_at is set once, by the first commit that makes the session visible.
        # updated_at: over an older updated_seq only (see Touch). In this order:
        # MySQL evaluates SET left to right, each assignment seeing the ones before.
        s = SESSIONS.c
        newer = bindparam("us", type_=BigInteger)
        stmt = (
            update(SESSIONS)
            .where(s.key == bindparam("k"))
            .ordered_values(
                (s.created_at, case((s.created_at == 0, bindparam("t")), else_=s.created_at)),
                (
                    s.updated_at,
                    case(
                        (newer > s.updated_seq, bindparam("t")),
                        (and_(newer == 0, s.updated_seq == 0), greatest(d, s.updated_at, bindparam("t"))),
                        else_=s.updated_at,
                    ),
                ),
                (s.updated_seq, greatest(d, s.updated_seq, newer)),
                (s.last_seq, greatest(d, s.last_seq, bindparam("s"))),
            )
        )
        params = [
            {"k": k, "s": t.last_seq, "us": t.updated_seq, "t": t.updated_at} for k, t in sorted(plan.touched.items())
        ]
        await conn.execute(stmt, params)
