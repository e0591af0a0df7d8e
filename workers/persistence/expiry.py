"""Session expiry: delete sessions idle for longer than their app's TTL.

Hosted by the persistence worker. It is the one kind every deployment runs
(no delete takes effect without it), it holds the SQL engine the sweep reads,
and it is the kind whose delete path the sweep feeds; a sweep in the query or
summarizer worker would add a reason to run those just for expiry.

One sweeper at a time across replicas: a :class:`~memq.workers.runtime.lease.Lease`
(NATS KV) decides which replica sweeps; the others try again each interval
and take over once a holder dies. A sweep does not delete anything itself:
it publishes the same :class:`~memq.contracts.schemas.SessionDeleted` that
``MemoryClient.delete_session`` publishes, so the delete takes its place in
stream order and every worker's delete path applies (SQL rows and tombstone,
the stream purged, the index, caches, artifact objects).

A delete is the same bytes from every sweep that finds the session unchanged
(:func:`expiry_message`), so its dedupe id (the subject, the id and a digest
of the bytes) makes a rerun, or two replicas overlapping at a lease handover,
one delete. The id can be predicted, and JetStream dedupes across the whole
stream: a duplicate ack is therefore checked against the stream
(:mod:`memq.contracts.landing`) before the delete counts as done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import NamedTuple

from nats.aio.client import Client as NATS
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from memq.contracts.codec import encode, subject_for
from memq.contracts.landing import MSG_ID, publish_landed
from memq.contracts.schemas import SessionDeleted
from memq.contracts.subjects import dedupe_id
from memq.workers import metrics
from memq.workers.runtime.event_streams import stream_of_subject
from memq.workers.runtime.lease import Lease
from memq.workers.settings import ExpirySettings, Settings
from memq.workers.sql.models import SESSIONS, USERS

log = logging.getLogger("memq.expiry")

LEASE_KEY = "session-expiry"
REMEMBERED = 10_000  # squatted ids whose fresh replacement a replica keeps (see SessionSweeper._fresh)


class Idle(NamedTuple):
    """A session found idle: where it is, and its last write (seq, time)."""

    app: str
    user: str
    session: str
    key: str
    last_seq: int
    updated_at: float


def expiry_message(idle: Idle, ttl: float) -> SessionDeleted:
    """The delete the sweep publishes for ``idle``: the same bytes from
    every sweep that finds the session as it is (its id names the session's
    last write; its timestamp is the moment it expired, not the sweep's
    clock), so a rerun or another replica publishes the very same message and
    JetStream, deduplicating on a digest of those bytes, stores it once."""
    return SessionDeleted(
        app=idle.app,
        user=idle.user,
        session=idle.session,
        id=f"expired:{idle.key}:{idle.last_seq}",
        timestamp=idle.updated_at + ttl,
    )


async def idle_sessions(engine: AsyncEngine, expiry: ExpirySettings, now: float, limit: int) -> list[Idle]:
    """The visible sessions whose last write is older than their app's TTL,
    at most ``limit``, oldest first per app. Per app, a range of the (app,
    updated_at, key) index."""
    found: list[Idle] = []
    s = SESSIONS.c
    async with engine.connect() as conn:
        apps: Iterable[str] = expiry.apps if expiry.session_ttl_s is None else await _apps(conn)
        for app in sorted(apps):
            ttl = expiry.ttl_for(app)
            if ttl is None or len(found) >= limit:
                continue
            q = (
                select(s.app, s.user_id, s.session_id, s.key, s.last_seq, s.updated_at)
                .where(s.app == app, s.updated_at < now - ttl, s.last_seq > s.deleted_seq)
                .order_by(s.updated_at, s.key)
                .limit(limit - len(found))
            )
            found.extend(Idle(*row) for row in (await conn.execute(q)).all())
    return found


async def _apps(conn) -> list[str]:
    # The users table: far fewer rows than sessions, and every session's app is there.
    return [app for (app,) in (await conn.execute(select(USERS.c.app).distinct())).all()]


class SessionSweeper:
    """Runs :meth:`sweep` every ``expiry.sweep_interval_s`` while this
    replica holds the expiry lease."""

    def __init__(self, settings: Settings, nc: NATS, engine: AsyncEngine):
        self.settings, self.expiry = settings, settings.expiry
        self.js, self.engine = nc.jetstream(), engine
        self.lease = Lease(nc.jetstream(), LEASE_KEY, ttl_s=self.expiry.lease_ttl_s, replicas=settings.streams.replicas)
        self.expired = 0  # sessions this replica deleted (for tests and logs)
        self.squatted = 0  # deletes whose id another message held: published again under a fresh id
        # Squatted id -> the fresh id it went out under: a rerun of this
        # replica (the delete not yet committed) sends the same fresh id, and
        # so is the duplicate of its own first try, not a second delete.
        self._fresh: dict[str, str] = {}
        self._holding = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="session expiry")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._holding:
            await self.lease.release()
            self._holding = False

    async def _run(self) -> None:
        while True:
            try:
                if self._holding and self.lease.lost.is_set():
                    self._holding = False  # another replica took over
                if not self._holding:
                    self._holding = await self.lease.acquire()
                if self._holding:
                    await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS or SQL down: the next interval tries again
                log.warning("session expiry sweep failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.expiry.sweep_interval_s)

    async def sweep(self, now: float | None = None) -> int:
        """Delete the idle sessions found now (up to ``max_per_sweep``);
        the number of deletes that landed (not those already stored)."""
        now = time.time() if now is None else now
        idle = await idle_sessions(self.engine, self.expiry, now, self.expiry.max_per_sweep)
        landed = 0
        for found in idle:
            ttl = self.expiry.ttl_for(found.app)
            if ttl is None:  # the settings changed under the query: not this app's any more
                continue
            landed += await self._delete(expiry_message(found, ttl))
        if landed:
            self.expired += landed
            log.info("expired %d idle session(s)", landed)
        return landed

    async def _delete(self, message: SessionDeleted) -> bool:
        """Publish one expiry delete; whether it landed now (False: this very
        delete was stored before, by a rerun or another replica).

        The id is the subject's, the message id and a digest of the bytes
        (:func:`expiry_message`: the same for every rerun). Any app can
        predict it and publish it first on its own subject, which JetStream
        would answer as a duplicate: :func:`publish_landed` reads what the
        ack points at and, if it is not this delete, publishes it again under
        a fresh random id. (A write that lands between the read and this
        publish is deleted with the session: idle for a whole TTL and written
        in the same instant is the rare case.)"""
        subject, data = subject_for(message), encode(message)
        msg_id = dedupe_id(subject, message.id, data)
        where = await publish_landed(
            self.js,
            subject,
            data,
            {MSG_ID: msg_id},
            stream_of_subject(self.settings.streams, subject),
            fresh=self._fresh.get(msg_id),
        )
        if where.squatted is not None:
            self.squatted += 1
            metrics.SQUATTED_IDS.labels("expiry").inc()
            if len(self._fresh) >= REMEMBERED:
                self._fresh.pop(next(iter(self._fresh)))
            self._fresh[msg_id] = where.msg_id
            log.warning(
                "expiry of %s/%s/%s: its Nats-Msg-Id was taken by another message (seq %d); "
                "published again as %s at seq %d",
                message.app,
                message.user,
                message.session,
                where.squatter_seq,
                where.msg_id,
                where.seq,
            )
        return not where.stored_before
