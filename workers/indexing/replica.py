"""One replica's share of a rebuild: pull from the job's durable consumer,
embed in batches as the live path does, write into the job's generation, ack.

Every indexing worker runs a :class:`RebuildFollower`, which joins the
rebuild job in progress (:mod:`memq.workers.indexing.rebuild_job`) when its
embedder makes the job's vectors and leaves when the job is gone; ``memq
index rebuild`` runs a :class:`RebuildReplica` itself too, so it works with
no worker running. JetStream spreads the messages between them; a replica
that dies leaves its unacked batch to be redelivered after ``ack_wait``.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError
from sqlalchemy import exc as sa_exc

from memq.contracts.subjects import EVENTS_WILDCARD
from memq.workers import metrics
from memq.workers.index.backends.base import IndexUnavailable
from memq.workers.index.embedders.base import EmbedderError
from memq.workers.indexing.indexer import Applied, Indexer, redelivered
from memq.workers.indexing.rebuild_job import JobStore, RebuildJob, ReplicaShare, consumer_config, replica_id
from memq.workers.runtime.batch_policy import BackOff, BatchPolicy, Classify, NakOnCancel, Transient
from memq.workers.runtime.consumer import StreamConsumers, batch_stream
from memq.workers.runtime.event_streams import event_streams
from memq.workers.settings import Settings

log = logging.getLogger("memq.indexing")

RETRY_DELAY_S = 1.0  # the index or embedder failed a batch: redelivered after this
STOP_GRACE_S = 3.0  # stopping cuts the batch in hand short after this; it is redelivered
FOLLOW_EVERY_S = 1.0  # how often a worker looks for a rebuild job


class RebuildReplica:
    """Applies ``job``'s consumer into ``job.generation`` until stopped."""

    def __init__(self, nc: NATS, settings: Settings, indexer: Indexer, job: RebuildJob, store: JobStore, name: str):
        self.nc, self.settings, self.indexer, self.job, self.store = nc, settings, indexer, job, store
        self.share = ReplicaShare(replica=name)
        self.consumer: StreamConsumers | None = None

    async def start(self) -> None:
        """Raises NotFoundError if the job's consumer is gone (the job ended)."""
        s = self.settings.indexing
        self.consumer = StreamConsumers(
            self.nc,
            event_streams(self.settings.streams),
            subject=EVENTS_WILDCARD,
            config=consumer_config(self.settings, self.job.generation),
            handler=self.handle,
            batch_size=s.batch_size,
            batch_wait_s=s.batch_wait_s,
            create=False,  # never bring back the consumer of a job that ended
        )
        await self.consumer.start()
        log.info("rebuild: replica %s joined the rebuild of %s", self.share.replica, self.job.generation)

    async def stop(self) -> None:
        if self.consumer is None:
            return
        consumer, self.consumer = self.consumer, None
        try:
            await asyncio.wait_for(consumer.stop(), STOP_GRACE_S)
        except TimeoutError:
            log.info("rebuild: the batch in hand was cut short; it is redelivered")

    # A failed batch is redelivered after RETRY_DELAY_S, one cut short by a
    # stop at once (:mod:`memq.workers.runtime.batch_policy`).
    POLICY = BatchPolicy(
        [
            Classify(
                [
                    Transient(
                        (IndexUnavailable, EmbedderError, OSError, sa_exc.OperationalError, sa_exc.InterfaceError),
                        [RETRY_DELAY_S],
                    )
                ]
            ),
            BackOff("a batch", prefix="rebuild: "),
            NakOnCancel(),
        ]
    )

    async def handle(self, msgs: list[Msg]) -> None:
        job = self.job
        copied_upto = job.copied_upto.get(batch_stream(msgs), 0)
        items = [
            (seq, m)
            for seq, m in self.indexer.decode(msgs)
            if seq > copied_upto or job.in_scope(m.app, m.user)  # the copy holds the rest
        ]

        rewrite = redelivered(msgs)  # an earlier try may have written part of it

        async def index(_: list[Msg]) -> Applied:
            return await self.indexer.apply(items, generation=job.generation, rewrite=rewrite)

        await self.POLICY.run(msgs, index, self._ack)

    async def _ack(self, msgs: list[Msg], done: Applied) -> None:
        for msg in msgs:
            await msg.ack()
        self.share.messages += len(msgs)
        self.share.docs += done.docs
        metrics.REBUILD_DOCS.inc(done.docs)
        try:
            await self.store.record(self.job.generation, self.share)
        except NatsError as exc:  # only the share's display is late
            log.debug("rebuild: recording the share failed: %s", exc)


class RebuildFollower:
    """A worker's part in rebuilds: join the job in progress when this
    worker's embedder makes its vectors, leave when it is gone."""

    def __init__(self, nc: NATS, settings: Settings, indexer: Indexer, store: JobStore):
        self.nc, self.settings, self.indexer, self.store = nc, settings, indexer, store
        self.name = replica_id()
        self.replica: RebuildReplica | None = None
        self._skipped: str | None = None  # a job of another model, said once

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.step()
                except NatsError as exc:  # disconnected: look again later
                    log.debug("rebuild: looking for a job failed: %s", exc)
                await asyncio.sleep(FOLLOW_EVERY_S)
        finally:
            await self.leave()

    async def step(self) -> None:
        job = await self.store.get()
        current = self.replica.job.generation if self.replica else None
        wanted = job if job is not None and self._fits(job) else None
        if current is not None and (wanted is None or wanted.generation != current):
            await self.leave()
        if wanted is not None and self.replica is None:
            replica = RebuildReplica(self.nc, self.settings, self.indexer, wanted, self.store, self.name)
            try:
                await replica.start()
            except NotFoundError:
                return  # the job is ending: its consumer is gone
            self.replica = replica

    def _fits(self, job: RebuildJob) -> bool:
        embedder = self.indexer.embedder
        if (job.model, job.dim) == (embedder.model, embedder.dim):
            return True
        if self._skipped != job.generation:
            self._skipped = job.generation
            log.warning(
                "rebuild of %s embeds with %s/%d and this worker with %s/%d: not joining it",
                job.generation,
                job.model,
                job.dim,
                embedder.model,
                embedder.dim,
            )
        return False

    async def leave(self) -> None:
        if self.replica is not None:
            replica, self.replica = self.replica, None
            await replica.stop()
            log.info("rebuild: replica %s left the rebuild of %s", self.name, replica.job.generation)
