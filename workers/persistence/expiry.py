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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from nats.aio.client import Client as NATS
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from memq.contracts.codec import encode, subject_for
from memq.contracts.schemas import SessionDeleted
from memq.contracts.subjects import dedupe_id
from memq.workers.runtime.lease import Lease
from memq.workers.settings import ExpirySettings, Settings
from memq.workers.sql.models import SESSIONS, USERS

log = logging.getLogger("memq.expiry")

LEASE_KEY = "session-expiry"


async def idle_sessions(
    engine: AsyncEngine, expiry: ExpirySettings, now: float, limit: int
) -> list[tuple[str, str, str, str, int]]:
    """(app, user, session, key, last_seq) of visible sessions whose last
    write is older than their app's TTL, at most ``limit``, oldest first per
    app. Per app, a range of the (app, updated_at, key) index."""
    found: list[tuple[str, str, str, str, int]] = []
    s = SESSIONS.c
    async with engine.connect() as conn:
        apps: Iterable[str] = expiry.apps if expiry.session_ttl_s is None else await _apps(conn)
        for app in sorted(apps):
            ttl = expiry.ttl_for(app)
            if ttl is None or len(found) >= limit:
                continue
            q = (
                select(s.app, s.user_id, s.session_id, s.key, s.last_seq)
                .where(s.app == app, s.updated_at < now - ttl, s.last_seq > s.deleted_seq)
                .order_by(s.updated_at, s.key)
                .limit(limit - len(found))
            )
            found.extend(tuple(row) for row in (await conn.execute(q)).all())
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
        """Delete the idle sessions found now (up to ``max_per_sweep``)."""
        now = time.time() if now is None else now
        idle = await idle_sessions(self.engine, self.expiry, now, self.expiry.max_per_sweep)
        for app, user, session, key, last_seq in idle:
            # The id names the session and its last write: a sweep that runs
            # again before the delete is committed publishes the same delete
            # (with another timestamp), which JetStream drops as a duplicate:
            # so the dedupe id is the id alone, scoped to the session's
            # subject. Only the session's own app can publish there, and all
            # it could do is put off its own session's expiry, as any write to
            # it does. (A write that lands between the read and this publish
            # is deleted with the session: idle for a whole TTL and written in
            # the same instant is the rare case.)
            message = SessionDeleted(app=app, user=user, session=session, id=f"expired:{key}:{last_seq}")
            subject = subject_for(message)
            await self.js.publish(
                subject,
                encode(message),
                stream=self.settings.streams.events,
                headers={"Nats-Msg-Id": dedupe_id(subject, message.id)},
            )
        if idle:
            self.expired += len(idle)
            log.info("expired %d idle session(s)", len(idle))
        return len(idle)
