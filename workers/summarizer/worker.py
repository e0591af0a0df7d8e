"""The summarizer worker: checkpoint summaries that keep endless sessions
within their token budget (docs/design.md, Working memory and recall: ``summary_buffer``).

Triggers: commit notices (``memq.v1.changed.>``, one replica per notice via
a queue group) and a periodic sweep of SQL for sessions over the threshold,
so a lost notice delays a summary but never loses one.

For a session whose app uses ``summary_buffer``, the pure policy
(:func:`memq.workers.memory.strategies.fold`) says whether a summary is due and
up to which sequence. The worker then:

1. takes the session's lease (a NATS KV key with a TTL): one summarizer per
   session across replicas; a crashed holder's lease expires;
2. announces ``{"state": "summarizing"}`` on ``memq.v1.status.<app>.<user>.<session>``;
3. folds the previous summary and the events up to that sequence into a new
   summary (extractive, or an OpenAI-compatible LLM);
4. publishes a checkpoint on the session's subject with an id derived from
   the session and the sequence, so a second replica cannot create two (SQL
   keeps one per id); the persistence worker commits it like any event;
5. checks that SQL has it once committed: if not (another message took its
   id), that is a failure, retried after ``retry_after_s``, never at once.

A failure never blocks persistence or queries (history stays within budget
by ``token_window`` rules until a summary exists): it is logged, counted and
retried after ``retry_after_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from faststream.nats import NatsRouter
from nats.aio.client import Client as NATS

from memq.contracts.codec import encode, msg_id, subject_for
from memq.contracts.errors import NotCommitted
from memq.contracts.ids import scope_key
from memq.contracts.landing import MSG_ID, publish_landed
from memq.contracts.notices import CommitNotice, StatusEvent
from memq.contracts.schemas import CheckpointSaved
from memq.contracts.subjects import CHANGED_WILDCARD, status_subject
from memq.workers import metrics
from memq.workers.memory.extractive import Turn
from memq.workers.memory.strategies import Strategy, fold, strategy_for
from memq.workers.memory.tokens import count_text, event_text
from memq.workers.runtime import readiness
from memq.workers.runtime.commit_floor import CommitFloor
from memq.workers.runtime.component import Component, Live, NotOpened
from memq.workers.runtime.event_streams import event_streams
from memq.workers.runtime.lease import Lease
from memq.workers.settings import Settings
from memq.workers.sql import reads
from memq.workers.sql.window import load_window
from memq.workers.summarizer.base import Summarizer, SummarizerError
from memq.workers.summarizer.summarizers import open_summarizer

if TYPE_CHECKING:
    from faststream.nats.publisher.usecase import LogicPublisher
    from nats.js.api import PubAck
    from sqlalchemy.ext.asyncio import AsyncEngine

    from memq.workers.memory.strategies import Fold
    from memq.workers.runtime.readiness import Check
    from memq.workers.runtime.resources import Resources

log = logging.getLogger("memq.summarizer")

COMMIT_WAIT_S = 10.0  # how long a published checkpoint may take to reach SQL


class CheckpointNotStored(Exception):
    """A published checkpoint is not in SQL once its sequence is committed."""


def checkpoint_id(session_key: str, up_to_seq: int) -> str:
    """Deterministic: the same fold has the same id in every replica, so SQL
    stores it once. Its Nats-Msg-Id (``codec.msg_id``) also holds a
    digest of the summary and timestamp: an app that predicts the id cannot
    make JetStream drop the checkpoint as a duplicate."""
    return f"checkpoint-{session_key[:32]}-{up_to_seq}"


def chunked(turns: list[Turn], limit: int, model: str | None) -> list[list[Turn]]:
    """Consecutive runs of turns of at most ``limit`` tokens (a longer turn alone)."""
    chunks: list[list[Turn]] = [[]]
    used = 0
    for turn in turns:
        cost = count_text(f"{turn.author}: {turn.text}", model) + 8  # the line's date and newline
        if chunks[-1] and used + cost > limit:
            chunks.append([])
            used = 0
        chunks[-1].append(turn)
        used += cost
    return [c for c in chunks if c]


@dataclass
class Stats:
    checkpoints: int = 0
    failures: int = 0
    skipped_busy: int = 0  # another replica held the session's lease


@dataclass
class SummarizerLive(Live):
    """What a running summarizer uses."""

    engine: AsyncEngine
    summarizer: Summarizer
    floors: dict[str, CommitFloor]  # by events stream: a checkpoint's commit is waited for on its stream's


class SummarizerWorker(Component[SummarizerLive]):
    """The summarizer component of a worker process (:mod:`memq.workers.runtime.app`);
    see the module doc. The process hands it the SQL engine."""

    KIND = "summarizer"
    DESCRIPTION = "memq: checkpoint summaries"
    NEEDS = frozenset({"sql"})

    def __init__(self, settings: Settings, *, summarizer: Summarizer | None = None):
        super().__init__(settings)
        self._given = summarizer  # used instead of the one the settings name
        self._status_publisher: LogicPublisher | None = None  # declared by router()
        self.stats = Stats()
        self._slots = asyncio.Semaphore(settings.summarizer.max_concurrent)
        self._pending: set[tuple[str, str, str]] = set()  # sessions queued or in progress here
        # Pending sessions whose notice came while they were: the look in
        # progress may have read the session before that commit.
        self._again: set[tuple[str, str, str]] = set()
        self._retry_at: dict[tuple[str, str, str], float] = {}
        self._tasks: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None
        self._triggered = False  # open: notices may schedule work

    @property
    def status(self) -> LogicPublisher:
        """The status-event publisher."""
        if self._status_publisher is None:
            raise NotOpened("the summarizer's status publisher is used before router()")
        return self._status_publisher

    # --- lifecycle (driven by the process's FastStream hooks) ----------------------

    def router(self) -> NatsRouter:
        """The trigger (commit notices, one replica each) and the status events."""
        router = NatsRouter()
        router.subscriber(
            CHANGED_WILDCARD,
            queue=self.settings.summarizer.queue_group,
            title="memq.v1.changed.>:summarizer",
            description="Summarizer trigger: a committed session may be due a checkpoint summary "
            "(one replica per notice, by queue group). A periodic sweep catches lost notices.",
        )(self.on_commit)
        self._status_publisher = router.publisher(
            "memq.v1.status.{app}.{user}.{session}",
            schema=StatusEvent,
            title="memq.v1.status.<app>.<user>.<session>:publish",
            description="What the summarizer is doing to a session: summarizing, then summarized "
            "or failed. Core NATS; clients watch it (MemoryClient.watch_status).",
        )
        return router

    async def build(self, nc: NATS, resources: Resources) -> SummarizerLive:
        s = self.settings
        js = nc.jetstream()
        summarizer = self._given or open_summarizer(s.summarizer)
        floors = {stream: CommitFloor(js, stream, s.persistence.durable) for stream in event_streams(s.streams)}
        live = SummarizerLive(nc, js, resources.engine, summarizer, floors)
        self._triggered = True
        return live

    def checks(self) -> dict[str, Check]:
        return {**super().checks(), "database": readiness.database(lambda: self.live.engine)}

    async def run(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="summarizer sweep")
        log.info("summarizer worker started (%s)", self.settings.summarizer.kind)

    async def halt(self) -> None:
        self._triggered = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._live is not None:
            await self._live.summarizer.close()
        elif self._given is not None:
            await self._given.close()

    # --- triggers -------------------------------------------------------------------

    async def on_commit(self, notice: CommitNotice) -> None:
        """A commit notice: look whether the session is due a summary."""
        if not self._triggered or notice.deleted or notice.session is None:
            return
        self.schedule(notice.app, notice.user, notice.session)

    def schedule(self, app: str, user: str, session: str) -> None:
        key = (app, user, session)
        if key in self._pending:
            self._again.add(key)
            return
        if self._retry_at.get(key, 0) > time.monotonic():
            return
        if not self._strategy(app).from_checkpoint:
            return
        self._pending.add(key)
        task = asyncio.create_task(self._run(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.summarizer.sweep_interval_s)
            try:
                for app, user, session in await self.sessions_over_threshold():
                    self.schedule(app, user, session)
            except Exception as exc:  # the database is down: the next sweep tries again
                log.warning("sweep failed: %s", exc)

    async def sessions_over_threshold(self) -> list[tuple[str, str, str]]:
        """Sessions whose tokens after their latest checkpoint pass the
        smallest threshold of any summary_buffer app (each is then checked
        against its own app's policy)."""
        limits = [
            int(st.budget * st.threshold)
            for st in [self._strategy(None)] + [self._strategy(app) for app in self.settings.query.apps]
            if st.from_checkpoint
        ]
        if not limits:
            return []
        async with self.live.engine.connect() as conn:
            return await reads.sessions_over_tokens(conn, min(limits))

    def _strategy(self, app: str | None) -> Strategy:
        overrides = self.settings.query.apps.get(app, {}) if app else {}
        return strategy_for(self.settings.memory, overrides, None)

    # --- one session ------------------------------------------------------------------

    async def _run(self, key: tuple[str, str, str]) -> None:
        made = None
        try:
            async with self._slots:
                made = await self.summarize_session(*key)
        except Exception as exc:
            self.stats.failures += 1
            metrics.SUMMARIES.labels("failed").inc()
            self._retry_at[key] = time.monotonic() + self.settings.summarizer.retry_after_s
            log.warning("summary of %s failed (%s: %s); retrying later", key, type(exc).__name__, exc)
        finally:
            self._pending.discard(key)
        noticed = key in self._again
        self._again.discard(key)
        if made is not None or noticed:
            # Notices that came while this look ran found the session pending:
            # the look may have read it before their commits (a lost wake-up,
            # with no sweep until the next interval), and after a fold its own
            # checkpoint's notice is among them, and other replicas found it
            # leased. Look again until nothing is due.
            self.schedule(*key)

    async def summarize_session(self, app: str, user: str, session: str) -> int | None:
        """Publish a checkpoint if one is due; returns its up_to_seq, or None."""
        strategy = self._strategy(app)
        if not strategy.from_checkpoint:
            return None
        session_key = scope_key(app, user, session)
        if await self._plan(session_key, strategy) is None:
            return None
        lease = Lease(
            self.live.js,
            f"summarize.{session_key}",
            ttl_s=self.settings.summarizer.lease_ttl_s,
            replicas=self.settings.streams.replicas,
        )
        if not await lease.acquire():
            self.stats.skipped_busy += 1
            metrics.SUMMARIES.labels("busy").inc()
            return None
        try:
            planned = await self._plan(session_key, strategy)  # another replica may have just done it
            if planned is None:
                return None
            plan, previous, turns = planned
            up_to = plan.up_to
            await self._status(app, user, session, "summarizing", up_to_seq=up_to)
            try:
                started = time.perf_counter()
                summary = await self._fold(turns, previous, plan.summary_tokens)
                metrics.SUMMARY_SECONDS.labels(self.live.summarizer.name).observe(time.perf_counter() - started)
            except SummarizerError:
                await self._status(app, user, session, "failed", up_to_seq=up_to)
                raise
            if lease.lost.is_set():
                return None  # another replica owns the session now; let it publish
            ack = await self._publish(app, user, session, session_key, summary, up_to)
            # Hold the lease until the checkpoint is in SQL: a plan made
            # before that would fold the same events again.
            try:
                await self.live.floors[ack.stream].wait_for(ack.seq, COMMIT_WAIT_S)
            except NotCommitted:
                log.warning("checkpoint at seq %d not committed after %.0fs", ack.seq, COMMIT_WAIT_S)
            else:
                await self._check_stored(session_key, up_to, ack)
            await self._status(app, user, session, "summarized", up_to_seq=up_to)
            metrics.SUMMARIES.labels("duplicate" if ack.duplicate else "checkpoint").inc()
            if not ack.duplicate:
                self.stats.checkpoints += 1
            self._retry_at.pop((app, user, session), None)
            return up_to
        finally:
            await lease.release()

    async def _check_stored(self, session_key: str, up_to: int, ack: PubAck) -> None:
        """Raise :class:`CheckpointNotStored` unless SQL now has a checkpoint
        up to ``up_to``: looking again at once would fold the same events and
        publish again, a tight loop (as when a message with this checkpoint's
        id took its place). Raised, it is a failure retried after
        ``retry_after_s``."""
        async with self.live.engine.connect() as conn:
            latest = await reads.latest_checkpoint(conn, session_key)
        if latest is None or latest.up_to_seq < up_to:
            raise CheckpointNotStored(
                f"checkpoint up to seq {up_to} published at seq {ack.seq}"
                f"{' (a duplicate)' if ack.duplicate else ''} is not in SQL once committed: "
                "another message with its id was stored first, or the session was deleted"
            )

    async def _plan(self, session_key: str, strategy: Strategy) -> tuple[Fold, str | None, list[Turn]] | None:
        """What is due (the fold, the previous summary, the turns to fold), or None."""
        async with self.live.engine.connect() as conn:
            window = await load_window(conn, session_key, strategy, self.settings.memory.model)
        plan = fold(window.items, strategy, reserved=window.checkpoint.tokens if window.checkpoint else 0)
        if plan is None:
            return None
        turns: list[Turn] = []
        for item in window.items:
            if item.seq <= plan.up_to:
                event = window.events[item.seq]
                text = event_text(event)
                if text.strip():
                    turns.append(Turn(author=event.get("author", ""), text=text, timestamp=event.get("timestamp")))
        previous = window.checkpoint.summary if window.checkpoint else None
        return plan, previous, turns

    async def _fold(self, turns: list[Turn], previous: str | None, target: int) -> str:
        """Summarize in chunks of at most ``max_input_tokens``, each folding
        the summary so far: a model's context window bounds a chunk, not a fold."""
        summary = previous
        # Counting a turn's tokens takes ~40 ms a MB of prose: in a thread, so
        # that another app's huge turns do not stall the loop (the query
        # worker's, in a `memq up` process). tiktoken lets go of the GIL.
        chunks = await asyncio.to_thread(
            chunked, turns, self.settings.summarizer.max_input_tokens, self.settings.memory.model
        )
        for chunk in chunks:
            summary = await self.live.summarizer.summarize(chunk, previous=summary, target_tokens=target)
        return summary or ""

    async def _publish(self, app: str, user: str, session: str, session_key: str, summary: str, up_to: int) -> PubAck:
        message = CheckpointSaved(
            app=app,
            user=user,
            session=session,
            id=checkpoint_id(session_key, up_to),
            summary=summary,
            up_to_seq=up_to,
            author=f"summarizer:{self.settings.summarizer.kind}",
        )
        data = encode(message)
        # The id holds a digest of the summary and timestamp, and a duplicate
        # ack is still read back: only this very checkpoint counts as stored.
        where = await publish_landed(self.live.js, subject_for(message), data, {MSG_ID: msg_id(message, data)})
        if where.squatted is not None:
            metrics.SQUATTED_IDS.labels("summarizer").inc()
            log.warning(
                "checkpoint id %s was taken by seq %s: sent again as %s",
                where.squatted,
                where.squatter_seq,
                where.msg_id,
            )
        ack = where.ack
        log.info(
            "checkpoint of %s/%s/%s up to seq %d at seq %d%s",
            app,
            user,
            session,
            up_to,
            ack.seq,
            " (duplicate)" if ack.duplicate else "",
        )
        return ack

    async def _status(self, app: str, user: str, session: str, state: str, up_to_seq: int | None = None) -> None:
        event = StatusEvent(app=app, user=user, session=session, state=state, up_to_seq=up_to_seq)
        await self.status.publish(event.encode(), subject=status_subject(app, user, session))
