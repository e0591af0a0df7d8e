"""The indexing worker: embeds the event log into the long-term memory index.

The index is derived (SQL is the truth) and can always be rebuilt from the
stream. One durable pull consumer (``memq-indexing``) on each events stream
(:mod:`memq.workers.runtime.event_streams`) is shared by all replicas: one
app's backlog on its own stream never holds another app's messages back. For each batch: decode, keep what the storage scope indexes
(:func:`memq.workers.memory.recall.doc_for`), embed, upsert, apply session and user
deletes in order, then ack, then announce the acked sequences on
``memq.v1.committed.<durable>[.<stream>]`` (:func:`memq.workers.runtime.commit_floor.announce_finished`,
as the persistence replicas do): query workers move their indexing floor on
it, so a search waiting for the caller's write goes the moment it is
indexed. An index or embedder outage naks the batch with a
growing delay (an index outage is cut short: the worker asks the index every
half second and retries once it answers): nothing is acked before it is
indexed, and nothing is lost.

On start the worker compares its embedder with the live generation's model:
none yet, or another model or dimension, means a rebuild into a fresh
generation (one replica at a time, under a lease) before any live writes, so
vectors of two models never mix. Writes name the generation they were
checked against: a write racing a switch to another generation fails and is
retried against the new one, never lands in the wrong one.

Once running, the worker also takes its share of any rebuild in progress
(:class:`~memq.workers.indexing.replica.RebuildFollower`): ``memq index
rebuild`` replays the stream through a durable consumer that every replica
pulls from.

Stopping never waits for a rebuild: the preparation runs as a task that
:meth:`IndexingWorker.stop` cancels (the rebuild's job stays, and the next
start resumes it where its consumer stands), and the batch in hand gets
``stop_grace_s`` to finish before it is cut short and naked for redelivery.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

from faststream.nats import NatsRouter
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from sqlalchemy import exc as sa_exc

from memq.contracts.notices import CommittedRanges
from memq.contracts.subjects import EVENTS_WILDCARD, committed_subject
from memq.workers import metrics
from memq.workers.index.backends.base import IndexBackend, IndexMeta, IndexUnavailable
from memq.workers.index.embedders.base import Embedder, EmbedderError
from memq.workers.indexing.indexer import Indexer, make_indexer, redelivered
from memq.workers.indexing.rebuild import REBUILD_LEASE, Progress, rebuild
from memq.workers.indexing.rebuild_job import JobStore
from memq.workers.indexing.replica import RebuildFollower
from memq.workers.runtime import readiness
from memq.workers.runtime.batch_policy import (
    AdjustRetry,
    BackOff,
    BatchPolicy,
    Classify,
    Measure,
    NakOnCancel,
    Outage,
    Retry,
    Transient,
)
from memq.workers.runtime.bus import patiently
from memq.workers.runtime.commit_floor import announce_finished
from memq.workers.runtime.component import Component, Live, NotOpened
from memq.workers.runtime.consumer import StreamConsumers, batch_stream
from memq.workers.runtime.event_streams import event_streams, notice_subject
from memq.workers.runtime.lease import Lease
from memq.workers.settings import Settings

if TYPE_CHECKING:
    from memq.workers.runtime.readiness import Check
    from memq.workers.runtime.resources import Resources

SQL_RETRY_DELAYS_S = [0.2, 0.5, 1.0]  # a database outage: reconnecting is cheap, the batch is small
log = logging.getLogger("memq.indexing")

PROGRESS_EVERY_S = 10.0  # how often a startup rebuild logs how far it is


@dataclass
class IndexingLive(Live):
    """What a running indexing worker uses: the index, the embedder and the indexer over them."""

    backend: IndexBackend
    embedder: Embedder
    indexer: Indexer


@dataclass
class Prepared:
    """What the indexing worker runs once its index is prepared (in the
    background: see :meth:`IndexingWorker.run`): the batch consumer, and its
    part in rebuilds (:class:`~memq.workers.indexing.replica.RebuildFollower`)."""

    consumer: StreamConsumers  # one per events stream
    follower: RebuildFollower


def _said_if_failed(task: asyncio.Task) -> None:
    """A background task that ends in an error says so: the replica is then
    never ready, and its log is where an operator looks first."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s failed: the replica will not become ready", task.get_name(), exc_info=exc)


class IndexingWorker(Component[IndexingLive]):
    """The indexing component of a worker process (:mod:`memq.workers.runtime.app`).

    :param settings: everything; ``settings.indexing`` above all. The index
        and the embedder are the process's
        (:class:`~memq.workers.runtime.resources.Resources`).
    """

    KIND = "indexing"
    DESCRIPTION = "memq: embeds the event log into the index"
    NEEDS = frozenset({"index", "embedder"})
    PREPARES = True  # ready once the index is usable and the consumer runs
    stop_grace_s = 5.0  # how long stop() lets the batch in hand finish before cutting it short

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self._generation: IndexMeta | None = None  # where live writes go; set by preparing the index
        self.prepared: Prepared | None = None  # once the index is prepared
        # In the background: preparing the index (run()), then following rebuilds.
        self._tasks: list[asyncio.Task] = []

    @property
    def indexed(self) -> int:
        return self._live.indexer.totals.docs if self._live is not None else 0

    @property
    def generation(self) -> IndexMeta:
        """The live generation, which writes go to; known once the index is prepared."""
        if self._generation is None:
            raise NotOpened("the indexing worker's generation is used before the index is prepared")
        return self._generation

    # --- lifecycle (driven by the process's FastStream hooks) ----------------------

    def consumer_config(self, start_seq: int | None = None) -> ConsumerConfig:
        s = self.settings.indexing
        return ConsumerConfig(
            durable_name=s.durable,
            deliver_policy=DeliverPolicy.ALL if start_seq is None else DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=s.ack_wait_s,
            max_deliver=-1,  # never give up while the index is down
            max_ack_pending=max(1000, s.batch_size * 8),
        )

    def router(self) -> NatsRouter:
        """No FastStream subscribers: the event log is read by the owned batch
        consumer (:mod:`memq.workers.runtime.consumer` says why). The publisher only
        documents the finished notices (AsyncAPI); handle() publishes them on
        the connection."""
        router = NatsRouter()
        router.publisher(
            committed_subject(self.settings.indexing.durable),
            schema=CommittedRanges,
            title="memq.v1.committed.<indexing durable>:publish",
            description="After every indexing batch, once its acks are out: the stream sequences this replica "
            "finished with (indexed, or skipped: nothing to index), as runs; `changed` is empty. Query workers "
            "join the runs into the indexing floor that a search's min_seq waits on; an app's own stream: "
            "`.<stream>` appended. Core NATS.",
        )
        return router

    async def build(self, nc: NATS, resources: Resources) -> IndexingLive:
        js = nc.jetstream()
        backend, embedder = resources.index, await resources.embedder()
        return IndexingLive(nc, js, backend, embedder, make_indexer(self.settings, backend, embedder, js))

    def checks(self) -> dict[str, Check]:
        return {
            **super().checks(),
            "index": readiness.index(self.ready, lambda: self.live.backend),
            "consumer": readiness.consumer(lambda: self.prepared.consumer if self.prepared is not None else None),
        }

    async def run(self) -> None:
        """Prepare the index and consume in the background: an index server
        that is down at start delays indexing, not the worker."""
        main = asyncio.create_task(self._prepare_and_consume(), name="indexing main")
        main.add_done_callback(_said_if_failed)
        self._tasks.append(main)

    async def halt(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        prepared, self.prepared = self.prepared, None
        if prepared is not None:
            try:
                # Embedding a batch can take many seconds on a busy machine:
                # cut it short (handle naks it) rather than hold the stop.
                await asyncio.wait_for(prepared.consumer.stop(), self.stop_grace_s)
            except TimeoutError:
                log.warning("stopping: the batch in hand took over %.0fs; it is redelivered", self.stop_grace_s)
        if self._live is not None and self._live.indexer.previous is not None:
            await self._live.indexer.previous.engine.dispose()

    async def _prepare_and_consume(self) -> None:
        delays = self.settings.indexing.retry_delays_s
        attempt = 0
        while True:
            try:
                await self.live.backend.open()
                starts = await self._ensure_generation()
                break
            except (IndexUnavailable, EmbedderError, OSError) as exc:
                delay = delays[min(attempt, len(delays) - 1)]
                log.warning("index not ready (%s); retrying in %.1fs", exc, delay)
                attempt += 1
                await asyncio.sleep(delay)
            except Exception as exc:  # noqa: BLE001 - this task is the replica's only way to ready
                # Anything else (two replicas creating the first generation at
                # once on an empty Weaviate met an error of the other's making)
                # once ended this task in silence, and the replica said
                # "preparing" for ever: say what failed, and try again.
                delay = delays[min(attempt, len(delays) - 1)]
                log.warning("preparing the index failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
                attempt += 1
                await asyncio.sleep(delay)
        s = self.settings.indexing
        live = self.live
        consumer = StreamConsumers(
            live.nc,
            event_streams(self.settings.streams),
            subject=EVENTS_WILDCARD,
            config=lambda stream: self.consumer_config(starts.get(stream)),
            handler=self.handle,
            batch_size=s.batch_size,
            batch_wait_s=s.batch_wait_s,
        )
        follower = RebuildFollower(
            live.nc, self.settings, live.indexer, JobStore(live.js, replicas=self.settings.streams.replicas)
        )
        self.prepared = Prepared(consumer, follower)  # halt() stops the consumer, even one cut short starting
        await consumer.start()
        self._tasks.append(asyncio.create_task(follower.run(), name="indexing rebuilds"))
        self.ready.set()
        log.info(
            "indexing worker started (durable %s, %s index %s, %s, scope %s)",
            s.durable,
            self.live.backend.name,
            self.generation.generation,
            self.live.embedder.model,
            s.storage_scope,
        )

    def _matches(self, meta: IndexMeta | None) -> bool:
        return meta is not None and (meta.model, meta.dim) == (self.live.embedder.model, self.live.embedder.dim)

    async def _ensure_generation(self) -> dict[str, int]:
        """Make the live generation hold our model's vectors, rebuilding if it
        does not. Returns where a *new* durable should start on each events
        stream (after what a rebuild replayed); a stream not named starts
        from the beginning."""
        live = await self.live.backend.live()
        if self._matches(live):
            self._generation = live
            return {}
        # Everything up to here is replayed by the rebuild below.
        js = self.live.js
        replayed_to = {
            stream: (await patiently("reading the stream", functools.partial(js.stream_info, stream))).state.last_seq
            for stream in event_streams(self.settings.streams)
        }
        async with Lease(
            self.live.js,
            REBUILD_LEASE,
            ttl_s=self.settings.indexing.rebuild_lease_ttl_s,
            replicas=self.settings.streams.replicas,
        ):
            live = await self.live.backend.live()  # another replica may have rebuilt meanwhile
            if not self._matches(live):
                if live is None:
                    log.info("no index yet: building it from the stream (%s)", self.live.embedder.model)
                else:
                    log.warning(
                        "the index holds %s/%d vectors and this worker embeds with %s/%d: rebuilding from the stream",
                        live.model,
                        live.dim,
                        self.live.embedder.model,
                        self.live.embedder.dim,
                    )
                result = await rebuild(
                    self.settings,
                    self.live.nc,
                    self.live.indexer,
                    progress=self._progress(),
                    lease=False,
                    conflict="restart",  # an unfinished rebuild of another model cannot serve this worker
                )
                log.info("rebuilt %d docs from %d messages in %.1fs", result.docs, result.replayed, result.seconds)
            self._generation = await self.live.backend.live()
        # A durable that does not exist yet need not re-index what the rebuild
        # just replayed; an existing one keeps its position (re-indexing is
        # idempotent).
        durable = self.settings.indexing.durable
        starts: dict[str, int] = {}
        for stream, last in replayed_to.items():
            try:
                await patiently("reading the consumer", functools.partial(js.consumer_info, stream, durable))
            except NotFoundError:
                if last:
                    starts[stream] = last + 1
        return starts

    def _progress(self) -> Progress:
        last = time.monotonic()

        def progress(done: int, total: int) -> None:
            nonlocal last
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                log.info("rebuilding the index: %d of %d messages", done, total)

        return progress

    # --- one batch --------------------------------------------------------------------

    @cached_property
    def _policy(self) -> BatchPolicy:
        """What a failed batch becomes (:mod:`memq.workers.runtime.batch_policy`):
        an index outage is waited out, the embedder's and the database's
        failures are retried after their delays, a switch to another
        generation is followed; nothing is dead-lettered here (the
        persistence worker does that, once per bad message)."""
        s = self.settings.indexing
        return BatchPolicy(
            [
                Classify(
                    [
                        # Cheap before costly: while the index is away, re-embedding
                        # each redelivered batch only takes CPU from everything else.
                        Outage(self._index_live, s.retry_delays_s, errors=(IndexUnavailable,), check_first=True),
                        Transient((EmbedderError, OSError), s.retry_delays_s),
                        # The database (the previous turns it reads) is away: try again
                        # soon, as the persistence worker does, not after the index's
                        # growing delays or the consumer's 5 s for a bug; searches wait
                        # on this worker once the database is back.
                        Transient((sa_exc.OperationalError, sa_exc.InterfaceError), SQL_RETRY_DELAYS_S),
                    ]
                ),
                AdjustRetry(self._follow_generation),
                Measure(self.KIND),
                BackOff("indexing", ack_wait_s=s.ack_wait_s),
                NakOnCancel(),
            ]
        )

    async def handle(self, msgs: list[Msg]) -> None:
        metrics.BATCH_SIZE.labels(self.KIND).observe(len(msgs))
        items = self.live.indexer.decode(msgs)
        rewrite = redelivered(msgs)  # an earlier try may have written part of it

        async def index(_: list[Msg]) -> None:
            await self.live.indexer.apply(items, generation=self.generation.generation, rewrite=rewrite)

        await self._policy.run(msgs, index, self._ack)

    async def _ack(self, msgs: list[Msg], _: None) -> None:
        acked: list[int] = []
        try:
            for msg in msgs:
                await msg.ack()
                acked.append(msg.metadata.sequence.stream)
        finally:  # what was acked is done, even if the connection failed part way
            subject = notice_subject(self.settings.streams, self.settings.indexing.durable, batch_stream(msgs))
            await announce_finished(self.live.nc, subject, acked)

    async def _follow_generation(self, retry: Retry) -> Retry:
        """A switch to another generation also fails writes: follow it at once
        if it holds our model, and stop writing (loudly) if it does not."""
        try:
            live = await self.live.backend.live()
        except Exception:
            return retry
        if live is None or live.generation == self.generation.generation:
            return retry
        if self._matches(live):
            log.info("the index switched to %s; writing there", live.generation)
            self._generation = live
            return replace(retry, delay=0.0, wait_for=None)
        log.error(
            "the live index now holds %s/%d vectors but this worker embeds with %s/%d: "
            "not indexing until it is restarted with the same embedder",
            live.model,
            live.dim,
            self.live.embedder.model,
            self.live.embedder.dim,
        )
        return replace(retry, delay=max(retry.delays), wait_for=None)

    async def _index_live(self) -> bool:
        await self.live.backend.live()  # raises IndexUnavailable while it is away
        return True
