"""The persistence worker: commits the event log to SQL, the source of truth.

One durable pull consumer (``memq-persistence``) on each events stream (one,
or the shared one and each app's: :mod:`memq.workers.runtime.event_streams`)
is shared by every replica, so adding processes scales out with no
coordination, and one app's backlog never queues another's batches. For
each batch (of one stream):

1. decode every message; a bad one goes to ``MEMQ_DLQ`` with its reason, then
   is acked (nothing is silently dropped, and the batch goes on);
2. commit the rest in one transaction (idempotent, order-independent), the
   events' tokens counted first (in a thread when the batch is large: the
   loop, shared with every other worker of a `memq up` process, keeps
   answering while another app's huge events are counted);
3. purge the stream of deleted sessions/users and forgotten events, so a
   replay cannot revive them;
4. ack, then announce ``memq.v1.changed.<app>.<user>.<session>``;
5. once the batch is through, announce on ``memq.v1.committed.<durable>``
   (``.<stream>`` for an app's stream) the stream sequences it finished with (committed or dead-lettered, so
   acked) as runs: query workers move their commit floor on it at once,
   rather than polling the consumer's ack floor (read-your-writes).

A database outage holds the batch for a growing delay, asking the database
every half second, and naks it the moment it answers: nothing is acked before
it is durable, nothing is lost, and commits resume within about half a second
of the repair. Acks are explicit, per message (see
:mod:`memq.workers.runtime.consumer` for why this loop does not use FastStream's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from faststream.nats import NatsRouter
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BucketNotFoundError, NotFoundError
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from memq.contracts.codec import decode_from_subject
from memq.contracts.dlq import DUPLICATE_ID
from memq.contracts.errors import Internal, MemqError
from memq.contracts.notices import CommitNotice, CommittedRanges
from memq.contracts.subjects import (
    ARTIFACT_BUCKET,
    CHANGED_WILDCARD,
    EVENTS_WILDCARD,
    changed_subject,
    committed_subject,
    events_subject,
    user_events_filter,
)
from memq.workers import metrics
from memq.workers.memory.commit_plan import Incoming, event_keys, event_tokens, reused_event_ids
from memq.workers.memory.tokens import encoding_for
from memq.workers.persistence.expiry import SessionSweeper
from memq.workers.persistence.store import CommitResult, SqlStore
from memq.workers.runtime import readiness
from memq.workers.runtime.batch_policy import (
    BackOff,
    BatchPolicy,
    Classify,
    DeadLetterPoison,
    Measure,
    Outage,
    Poison,
)
from memq.workers.runtime.commit_floor import announce_finished
from memq.workers.runtime.component import Component, Live
from memq.workers.runtime.consumer import StreamConsumers, batch_stream
from memq.workers.runtime.dead_letters import DeadLetters
from memq.workers.runtime.event_streams import event_streams, notice_subject, stream_of
from memq.workers.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from memq.workers.runtime.readiness import Check
    from memq.workers.runtime.resources import Resources

log = logging.getLogger("memq.persistence")

MAX_CONFLICT_RETRIES = 5
COUNT_OFF_LOOP_BYTES = 16 * 1024  # a batch's message bytes above which its tokens are counted in a thread
YIELD_BYTES = 256 * 1024  # decoded bytes after which the event loop runs before the next message


@dataclass
class PersistenceLive(Live):
    """What a running persistence worker uses: the process's engine and
    what is made from it, the batch consumer (started by run()) and the
    session sweeper (when ``expiry.enabled``)."""

    engine: AsyncEngine
    store: SqlStore
    dlq: DeadLetters
    consumer: StreamConsumers  # one per events stream
    sweeper: SessionSweeper | None


class PersistenceWorker(Component[PersistenceLive]):
    """The persistence component of a worker process (:mod:`memq.workers.runtime.app`):
    the batch consumer on the process's connection and the handling of one
    batch; see the module doc. The process hands it the SQL engine."""

    KIND = "persistence"
    DESCRIPTION = "memq: commits the event log to SQL"
    NEEDS = frozenset({"sql"})

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.committed = 0  # messages committed by this process (for status and tests)

    # --- lifecycle (driven by the process's FastStream hooks) ------------------

    def consumer_config(self) -> ConsumerConfig:
        p = self.settings.persistence
        return ConsumerConfig(
            durable_name=p.durable,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=p.ack_wait_s,
            max_deliver=-1,  # never give up on a message while the database is down
            max_ack_pending=max(1000, p.batch_size * 8),
        )

    def router(self) -> NatsRouter:
        """What this kind says on FastStream: the commit notices it publishes."""
        router = NatsRouter()
        # Declared for the AsyncAPI document: _announce and _announce_finished
        # publish on the connection itself.
        router.publisher(
            CHANGED_WILDCARD,
            schema=CommitNotice,
            title="memq.v1.changed.<app>.<user>[.<session>]:publish",
            description="After every commit: what a session or user committed (caches drop it, "
            "the summarizer looks whether a summary is due). Core NATS.",
        )
        router.publisher(
            committed_subject(self.settings.persistence.durable),
            schema=CommittedRanges,
            title="memq.v1.committed.<durable>:publish",
            description="After every batch, once its acks are out: the stream sequences this replica "
            "finished with (committed or dead-lettered), as runs. Query workers join the runs of every "
            "replica into the contiguous commit floor that read-your-writes waits on. An app's own stream "
            "(streams.apps) has its own sequences: its notices go to this subject with `.<stream>` appended. Core NATS.",
        )
        return router

    async def build(self, nc: NATS, resources: Resources) -> PersistenceLive:
        s = self.settings
        js = nc.jetstream()
        engine = resources.engine
        sqlite = engine.dialect.name == "sqlite"
        consumer = StreamConsumers(
            nc,
            event_streams(s.streams),
            subject=EVENTS_WILDCARD,
            config=self.consumer_config(),
            handler=self._handle_batch,
            batch_size=s.persistence.batch_size,
            batch_wait_s=s.persistence.batch_wait_s,
            concurrency=1 if sqlite else s.persistence.concurrency,
            serial=sqlite,  # one writer, whatever the streams
        )
        # Why expiry runs here and not in another kind: see expiry.py.
        sweeper = SessionSweeper(s, nc, engine) if s.expiry.enabled else None
        return PersistenceLive(nc, js, engine, SqlStore(engine), DeadLetters(js, self.KIND), consumer, sweeper)

    def checks(self) -> dict[str, Check]:
        return {
            **super().checks(),
            "consumer": readiness.consumer(lambda: self._live.consumer if self._live is not None else None),
            "database": readiness.database(lambda: self.live.engine),
        }

    async def run(self) -> None:
        live = self.live
        # Every event's tokens are counted at commit, and loading the encoding
        # takes ~0.2 s: not in the first batch's commit.
        await asyncio.to_thread(encoding_for)
        await live.consumer.start()
        if live.sweeper is not None:
            live.sweeper.start()
        log.info("persistence worker started (durable %s)", self.settings.persistence.durable)

    async def halt(self) -> None:
        """Finish and ack the batch in hand; the process then drains the
        connection (acks and notices go out) and disposes of the engine."""
        if (live := self._live) is None:  # open() was cut short
            return
        if live.sweeper is not None:
            await live.sweeper.stop()
        await live.consumer.stop()  # the batch in hand finishes and is acked

    # --- one batch ------------------------------------------------------------

    async def _handle_batch(self, msgs: list[Msg]) -> None:
        """One batch, then the notice of what it finished (even if handling
        failed part way: what was acked is done). Batches of one replica may
        run side by side (``persistence.concurrency``), so each has its own."""
        outcome = _Outcome(batch_stream(msgs))
        try:
            await self.handle(msgs, outcome)
        finally:
            await self._announce_finished(outcome)

    async def handle(self, msgs: list[Msg], outcome: _Outcome) -> None:
        metrics.BATCH_SIZE.labels(self.KIND).observe(len(msgs))
        items: list[Incoming] = []
        raw: list[Msg] = []
        unyielded = 0  # bytes decoded since the loop last ran
        for msg in msgs:
            # Decoding takes ~3 ms a MB, and a batch of huge events holds
            # hundreds of them: the loop runs between them.
            if (unyielded := unyielded + len(msg.data)) > YIELD_BYTES:
                unyielded = 0
                await asyncio.sleep(0)
            try:
                message = decode_from_subject(msg.subject, msg.data, max_bytes=self.settings.streams.max_message_bytes)
            except MemqError as exc:
                await self._dead_letter(msg, exc.code, exc.message, outcome)
                continue
            except Exception as exc:  # a decoder bug: one message must not stall the batch forever
                log.exception("decoding seq %s failed unexpectedly", msg.metadata.sequence.stream)
                reason = f"the decoder failed ({type(exc).__name__}: {exc}); a bug in memq: replay once fixed"
                await self._dead_letter(msg, Internal.code, reason, outcome)
                continue
            items.append(Incoming(msg.metadata.sequence.stream, message))
            raw.append(msg)
        if items:
            items, raw = await self._reject_reused_ids(items, raw, outcome)
        if items:
            await self._commit_and_ack(items, raw, outcome)

    async def _reject_reused_ids(
        self, items: list[Incoming], raw: list[Msg], outcome: _Outcome
    ) -> tuple[list[Incoming], list[Msg]]:
        """Dead-letter the events that reuse an id of their session with other
        content (:func:`~memq.workers.memory.commit_plan.reused_event_ids`); the rest."""
        keys = event_keys(items)
        if not keys:
            return items, raw
        try:
            reused = reused_event_ids(items, await self.live.store.stored_events(keys.values()))
        except Exception:
            # The commit that follows finds out whether the database is down.
            log.exception("checking %d event ids for reuse failed; committing without the check", len(keys))
            return items, raw
        if not reused:
            return items, raw
        for msg in raw:
            if (seq := msg.metadata.sequence.stream) in reused:
                await self._dead_letter(msg, DUPLICATE_ID, reused[seq], outcome)
        kept = [(i, m) for i, m in zip(items, raw, strict=True) if i.seq not in reused]
        return [i for i, _ in kept], [m for _, m in kept]

    @cached_property
    def _policy(self) -> BatchPolicy:
        """What a failed commit becomes (:mod:`memq.workers.runtime.batch_policy`):
        any failure while the database is down is waited out and retried;
        one while it answers is the batch's fault, so the batch is committed
        one by one and what the database rejects alone is dead-lettered."""
        p = self.settings.persistence
        return BatchPolicy(
            [
                Classify(
                    [
                        Outage(self._database_ok, p.retry_delays_s, confirm=True),
                        Poison("storage_rejected", _reason),
                    ]
                ),
                Measure(self.KIND),
                BackOff("commit", ack_wait_s=p.ack_wait_s),
                DeadLetterPoison(self.live.dlq, retry_delay_s=p.retry_delays_s[0]),
            ]
        )

    async def _commit_and_ack(self, items: list[Incoming], raw: list[Msg], outcome: _Outcome) -> None:
        by_seq = {item.seq: item for item in items}
        # Counting tokens is most of a large event's commit (a MB of
        # whitespace: ~0.9 s): in a thread, so that the loop (and every
        # other worker of a `memq up` process) keeps answering meanwhile,
        # and before the transaction, so that it holds no lock that long.
        # tiktoken lets go of the GIL. Small batches count inline: the hop
        # would cost more than the count.
        tokens = None
        if sum(len(msg.data) for msg in raw) > COUNT_OFF_LOOP_BYTES:
            try:
                tokens = await asyncio.to_thread(event_tokens, items)
            except Exception:  # counted again in the commit, where a failure is the batch policy's
                log.exception("counting the tokens of a batch of %d failed", len(items))

        async def commit(msgs: list[Msg]) -> CommitResult:
            return await self._commit([by_seq[msg.metadata.sequence.stream] for msg in msgs], tokens)

        async def finish(msgs: list[Msg], result: CommitResult) -> None:
            await self._finish(result, msgs, outcome)

        await self._policy.run(raw, commit, finish, finished=outcome.finished)

    async def _commit(self, items: Sequence[Incoming], tokens: Mapping[int, int] | None = None) -> CommitResult:
        """Commit, retrying at once on deadlocks and serialisation conflicts,
        which concurrent replicas can cause and which succeed on a retry."""
        for attempt in range(MAX_CONFLICT_RETRIES):
            try:
                return await self.live.store.commit(items, tokens)
            except sa_exc.OperationalError as exc:
                if not _is_conflict(exc) or attempt == MAX_CONFLICT_RETRIES - 1:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _database_ok(self) -> bool:
        try:
            async with self.live.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            return True
        except Exception:
            return False

    async def _finish(self, result: CommitResult, raw: list[Msg], outcome: _Outcome) -> None:
        await self._purge_deleted(result)
        for msg in raw:
            await msg.ack()
        outcome.finished.extend(msg.metadata.sequence.stream for msg in raw)
        self.committed += len(raw)
        await self._announce(result, outcome)

    async def _dead_letter(self, msg: Msg, code: str, reason: str, outcome: _Outcome) -> None:
        await self._policy.dead_letter(msg, code, reason, outcome.finished)

    # --- after commit ---------------------------------------------------------

    async def _purge_deleted(self, result: CommitResult) -> None:
        """Remove deleted sessions/users from the log (below the delete's own
        sequence) and their artifact objects, and forgotten events' own
        messages. Idempotent, so a crash before the ack only repeats it."""
        await self._delete_forgotten(result)
        if not (result.plan.session_deletes or result.plan.user_deletes):
            return
        streams = self.settings.streams
        prefixes: list[str] = []
        for session_key, seq in result.plan.session_deletes.items():
            s = result.scopes.sessions[session_key]
            stream = stream_of(streams, s.app)
            await self.live.js.purge_stream(stream, subject=events_subject(s.app, s.user, s.session), seq=seq)
            prefixes.append(f"{s.user_key}/{session_key}/")
        for user_key, seq in result.plan.user_deletes.items():
            u = result.scopes.users[user_key]
            stream = stream_of(streams, u.app)
            for subject in user_events_filter(u.app, u.user):
                await self.live.js.purge_stream(stream, subject=subject, seq=seq)
            prefixes.append(f"{user_key}/")
        await self._delete_objects(prefixes)

    async def _delete_forgotten(self, result: CommitResult) -> None:
        """Delete each forgotten event's own stream message, once it is sure
        to be an event of the forget's session (the subject names the
        scope, and a seq may be any message's). Idempotent: a message gone
        already (a redelivered or repeated forget) is skipped."""
        for session_key, forgotten in result.plan.forgets.items():
            s = result.scopes.sessions[session_key]
            stream = stream_of(self.settings.streams, s.app)
            subject = events_subject(s.app, s.user, s.session)
            for seq in sorted(forgotten):
                try:
                    raw = await self.live.js.get_msg(stream, seq=seq)
                except NotFoundError:
                    continue
                if raw.subject != subject or not _is_event(raw.subject, raw.data, self.settings):
                    continue
                try:
                    await self.live.js.delete_msg(stream, seq)
                except NotFoundError:  # another replica's redelivery deleted it meanwhile
                    pass

    async def _delete_objects(self, prefixes: list[str]) -> None:
        try:
            store = await self.live.js.object_store(ARTIFACT_BUCKET)
            infos = await store.list(ignore_deletes=True)
        except (BucketNotFoundError, NotFoundError):
            return  # no objects at all
        for info in infos:
            if info.name.startswith(tuple(prefixes)):
                await store.delete(info.name)

    async def _announce_finished(self, outcome: _Outcome) -> None:
        """Say which sequences this batch finished (after their acks, on the
        same connection): one small notice per batch, whatever it held."""
        # On the connection, like _announce: router() declares it for the docs.
        subject = notice_subject(self.settings.streams, self.settings.persistence.durable, outcome.stream)
        await announce_finished(self.live.nc, subject, outcome.finished, outcome.changed)

    async def _announce(self, result: CommitResult, outcome: _Outcome) -> None:
        """Tell caches and the summarizer what changed: one notice per session
        touched or deleted, one per user whose user or app state changed
        (unless ``persistence.publish_changed`` is off). The notices also go
        into the batch's :class:`CommittedRanges`, for the query replicas."""
        plan, scopes = result.plan, result.scopes
        publish = self.settings.persistence.publish_changed
        apps_changed = {app for app, _ in plan.app_state}
        users_changed = {user_key for user_key, _ in plan.user_state}

        async def notice(app: str, user: str, session: str | None, user_key: str, **fields) -> None:
            body = CommitNotice(
                app=app,
                user=user,
                session=session,
                app_state=app in apps_changed,
                user_state=user_key in users_changed,
                **fields,
            )
            outcome.changed.append(body)
            if publish:
                # Straight on the connection, in the batch's hot path: the publisher
                # router() declares documents the notice (AsyncAPI) at no cost per batch.
                await self.live.nc.publish(changed_subject(app, user, session), body.encode())

        for session_key, touch in plan.touched.items():
            s = scopes.sessions[session_key]
            await notice(s.app, s.user, s.session, s.user_key, seq=touch.last_seq)
        for session_key, seq in plan.session_deletes.items():
            s = scopes.sessions[session_key]
            await notice(s.app, s.user, s.session, s.user_key, seq=seq, deleted=True)
        for session_key, forgotten in plan.forgets.items():
            if session_key not in plan.touched:  # a touched session had its notice
                s = scopes.sessions[session_key]
                await notice(s.app, s.user, s.session, s.user_key, seq=max(forgotten.values()))
        for user_key, u in scopes.users.items():
            if user_key in plan.user_deletes:
                await notice(u.app, u.user, None, user_key, seq=plan.user_deletes[user_key], deleted=True)
            elif user_key in users_changed or u.app in apps_changed:
                await notice(u.app, u.user, None, user_key)


@dataclass
class _Outcome:
    """What one batch finished: the sequences of its stream it acked
    (committed or dead-lettered) and the commit notices of what it changed."""

    stream: str
    finished: list[int] = field(default_factory=list)
    changed: list[CommitNotice] = field(default_factory=list)


def _is_event(subject: str, data: bytes | None, settings: Settings) -> bool:
    try:
        message = decode_from_subject(subject, data or b"", max_bytes=settings.streams.max_message_bytes)
    except MemqError:
        return False
    return message.kind == "event"


def _reason(exc: Exception) -> str:
    """The driver's own message, without SQLAlchemy's statement and parameters."""
    orig = getattr(exc, "orig", None)
    return f"{type(orig or exc).__name__}: {orig or exc}"


def _is_conflict(exc: sa_exc.OperationalError) -> bool:
    text = str(exc.orig).lower() if exc.orig else str(exc).lower()
    return any(s in text for s in ("deadlock", "could not serialize", "lock wait timeout", "database is locked"))
