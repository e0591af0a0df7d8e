"""Rebuild the index into a fresh generation, then switch to it atomically.

The live generation keeps serving (and the live workers keep writing to it)
while a new generation is filled by a replay of the events streams (the
shared one and each app's: :mod:`memq.workers.runtime.event_streams`) from
their start. The replay is a *job* (:mod:`memq.workers.indexing.rebuild_job`):
a durable consumer that every indexing replica pulls from
(:mod:`memq.workers.indexing.replica`), and the process that runs
:func:`rebuild` too, so it also works with no worker running. The consumer
sees what is appended during the rebuild as well, so nothing written
meanwhile is missing from the new generation. Once the consumer has caught
up (nothing pending, nothing in flight),
:meth:`~memq.workers.index.backends.base.IndexBackend.promote` switches, and
the replay goes on until it has caught up again (the *tail*: what the live
workers wrote only to the old generation before the switch), then the
consumer and the job are deleted. Deletes replay in order with the events
they delete, and the persistence worker has already purged deleted sessions
from the stream and SQL, so deleted data does not come back.

A scoped rebuild (one app or user) first copies every doc outside the scope
from the live generation, vectors included; its replicas skip the messages
outside the scope that the copy already holds (up to the live consumer's ack
floor when the copy began) and apply everything after.

A rebuild that stops (a killed replica, CLI or stack, or a cancelled one)
leaves its job, and the next :func:`rebuild` resumes it where the consumer
stands; ``restart=True`` drops it and starts over. A generation that is
neither live nor a job's was left by a rebuild killed before its job was
recorded: the next rebuild drops it (:func:`drop_abandoned`), and ``memq index
generations`` lists it. Rebuilds hold the ``index-rebuild`` lease.

``source="sql"`` reads SQL instead of the stream, in this process alone
(SQL pages are not a shared queue), and is not resumable: a failed one drops
its generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from memq.contracts.ids import encode_token
from memq.contracts.subjects import EVENTS_WILDCARD, PREFIX, user_events_filter
from memq.workers.index.backends.base import IndexBackend
from memq.workers.index.embedders.floors import floor_for
from memq.workers.indexing.indexer import Indexer
from memq.workers.indexing.rebuild_job import (
    CONSUMER_PREFIX,
    JobStore,
    RebuildJob,
    ReplicaShare,
    consumer_config,
    consumer_name,
    replica_id,
)
from memq.workers.indexing.replica import RebuildReplica
from memq.workers.runtime.commit_floor import CommitFloor
from memq.workers.runtime.event_streams import event_streams
from memq.workers.runtime.lease import Lease
from memq.workers.settings import Settings

log = logging.getLogger("memq.indexing")

Progress = Callable[[int, int], None]  # (messages replayed, messages to replay), over every events stream
Notice = Callable[[str], None]
FETCH = 256
COMMIT_WAIT_S = 120.0  # source sql: how long persistence may lag behind the stream
REBUILD_LEASE = "index-rebuild"  # one rebuild at a time, across processes
POLL_S = 0.25  # how often the caught-up check reads the consumer
STALLED_S = 30.0  # no delivery for this long while messages wait: nobody is pulling


@dataclass
class RebuildResult:
    generation: str
    model: str
    replayed: int  # messages read from the source (all replicas)
    copied: int  # docs copied from the live generation (scoped rebuild)
    docs: int  # docs embedded (all replicas)
    seconds: float
    resumed: bool = False
    shares: list[ReplicaShare] = field(default_factory=list)  # what each replica did (stream source)


def scope_filter(app: str | None, user: str | None) -> list[str]:
    if user is not None:
        if app is None:
            raise ValueError("--user needs --app")
        return user_events_filter(app, user)
    if app is not None:
        return [f"{PREFIX}.ev.{encode_token(app, 'app')}.>"]
    return [EVENTS_WILDCARD]


def in_scope(doc, app: str | None, user: str | None) -> bool:
    return (app is None or doc.app == app) and (user is None or doc.user == user)


class StreamReplay:
    """An ephemeral, unacked consumer over the scope's subjects from sequence 1."""

    def __init__(self, js: JetStreamContext, stream: str, subjects: list[str], start_seq: int | None = None):
        self.js, self.stream, self.subjects, self.start_seq = js, stream, subjects, start_seq
        self._sub: JetStreamContext.PullSubscription | None = None  # set by open()

    async def open(self) -> int:
        """Create the consumer; returns how many messages it has to deliver now."""
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL if self.start_seq is None else DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.start_seq,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=300.0,  # the server removes it if we die
            mem_storage=True,
            filter_subjects=self.subjects if len(self.subjects) > 1 else None,
            filter_subject=self.subjects[0] if len(self.subjects) == 1 else None,
        )
        info = await self.js.add_consumer(self.stream, config)
        self._name = info.name
        self._sub = await self.js.pull_subscribe_bind(consumer=info.name, stream=self.stream)
        return info.num_pending or 0  # a new consumer's info always has it; None only in the type

    async def batches(self) -> AsyncIterator[list]:
        """Batches until nothing is pending at this moment."""
        if self._sub is None:
            raise RuntimeError("StreamReplay.batches() before open()")
        while True:
            try:
                msgs = await self._sub.fetch(FETCH, timeout=1.0)
            except TimeoutError:
                return
            if not msgs:
                return
            yield msgs
            if msgs[-1].metadata.num_pending == 0:
                return

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            try:
                await self.js.delete_consumer(self.stream, self._name)
            except Exception:  # already gone: inactive_threshold cleans up anyway
                pass


async def rebuild(
    settings: Settings,
    nc: NATS,
    indexer: Indexer,
    *,
    source: str = "stream",
    app: str | None = None,
    user: str | None = None,
    engine=None,
    progress: Progress | None = None,
    lease: bool = True,
    restart: bool = False,
    work: bool = True,
    conflict: Literal["fail", "restart"] = "fail",
    notice: Notice | None = None,
) -> RebuildResult:
    """Fill a fresh generation (or resume the unfinished one), promote it,
    then replay the tail. Returns once the new generation is live.

    :param source: ``stream`` (default) or ``sql`` (``engine`` needed).
    :param app: only this app is replayed (the rest is copied from the live
        generation); default None, everything.
    :param user: only this user of ``app``; default None.
    :param engine: the SQL engine for ``source="sql"``; default None.
    :param progress: called with (stream seq done, stream's last seq); default None.
    :param lease: take the ``index-rebuild`` lease for the rebuild (default
        True); False when the caller already holds it.
    :param restart: drop an unfinished rebuild instead of resuming it.
    :param work: this process pulls from the job's consumer too (default
        True); False leaves the replay to the indexing workers.
    :param conflict: an unfinished rebuild of another scope or model:
        ``fail`` (ValueError, default) or ``restart`` (drop it).
    :param notice: called with what an operator should know (resuming, no
        replica pulling).
    """
    say = notice or (lambda text: log.info("%s", text))
    args = (settings, nc, indexer, source, app, user, engine, progress, restart, work, conflict, say)
    if not lease:
        return await _rebuild(*args)
    async with Lease(
        nc.jetstream(), REBUILD_LEASE, ttl_s=settings.indexing.rebuild_lease_ttl_s, replicas=settings.streams.replicas
    ):
        return await _rebuild(*args)


async def drop_abandoned(
    backend: IndexBackend, js: JetStreamContext, settings: Settings, keep: str | None
) -> list[str]:
    """Drop every generation that is neither live nor ``keep`` (the job's),
    and every rebuild consumer but ``keep``'s: rebuilds killed before they
    recorded their job. Call only while holding the rebuild lease (otherwise
    it may be another process's rebuild starting). Returns the names dropped."""
    live = await backend.live()
    dropped = []
    for meta in await backend.generations():
        if meta.generation != keep and (live is None or meta.generation != live.generation):
            log.warning("dropping index generation %s, left by an interrupted rebuild", meta.generation)
            await backend.drop_generation(meta.generation)
            dropped.append(meta.generation)
    for stream in event_streams(settings.streams):
        try:
            infos = await js.consumers_info(stream)
        except NotFoundError:  # an app's stream not made yet
            continue
        for info in infos:
            name = info.name or ""
            if name.startswith(CONSUMER_PREFIX) and (keep is None or name != consumer_name(keep)):
                await _delete_consumer(js, stream, name)
    return dropped


async def end_job(store: JobStore, js: JetStreamContext, settings: Settings, job: RebuildJob) -> None:
    """The job's consumers (one per events stream), record and shares go
    (its generation stays)."""
    for stream in event_streams(settings.streams):
        await _delete_consumer(js, stream, job.consumer)
    await store.close(job)


async def _delete_consumer(js: JetStreamContext, stream: str, name: str) -> None:
    try:
        await js.delete_consumer(stream, name)
    except NotFoundError:
        pass


async def _rebuild(settings, nc, indexer, source, app, user, engine, progress, restart, work, conflict, say):
    js = nc.jetstream()
    backend: IndexBackend = indexer.backend
    store = JobStore(js, replicas=settings.streams.replicas)
    started = time.monotonic()
    drop_other = conflict == "restart"
    if source == "sql":
        await _unfinished(store, js, settings, indexer, app, user, restart, drop_other, say, resumable=False)
        await drop_abandoned(backend, js, settings, keep=None)
        return await _rebuild_sql(settings, js, indexer, app, user, engine, progress)
    job = await _unfinished(store, js, settings, indexer, app, user, restart, drop_other, say)
    resumed = job is not None
    await drop_abandoned(backend, js, settings, keep=job.generation if job else None)
    if job is None:
        job = await _start_job(store, js, settings, indexer, app, user)
    replica = None
    if work:
        replica = RebuildReplica(nc, settings, indexer, job, store, replica_id("rebuild"))
        await replica.start()
    try:
        await _caught_up(js, settings, job, progress, say)
        await backend.promote(job.generation)
        # Tail: what the live workers wrote to the old generation only.
        await _caught_up(js, settings, job, None, say)
    finally:
        if replica is not None:
            await replica.stop()
    shares = await store.shares(job.generation)
    await end_job(store, js, settings, job)
    return RebuildResult(
        generation=job.generation,
        model=job.model,
        replayed=sum(s.messages for s in shares),
        copied=job.copied,
        docs=sum(s.docs for s in shares),
        seconds=time.monotonic() - started,
        resumed=resumed,
        shares=shares,
    )


def describe_scope(app: str | None, user: str | None) -> str:
    if app is None:
        return "everything"
    return f"app {app}" + (f", user {user}" if user is not None else "")


async def _unfinished(
    store, js, settings, indexer, app, user, restart: bool, drop_other: bool, say: Notice, resumable: bool = True
) -> RebuildJob | None:
    """The unfinished job to resume, or None (none, gone, or dropped:
    ``restart``, or ``drop_other`` and it is of another scope or model).
    ``resumable`` False (an SQL rebuild): any unfinished job is in the way."""
    job = await store.get()
    if job is None:
        return None
    backend: IndexBackend = indexer.backend
    exists = job.generation in {m.generation for m in await backend.generations()}
    same = resumable and (job.app, job.user, job.model, job.dim) == (
        app,
        user,
        indexer.embedder.model,
        indexer.embedder.dim,
    )
    if exists and not same and not (restart or drop_other):
        flags = "".join(f" --{k} {v}" for k, v in (("app", job.app), ("user", job.user)) if v is not None)
        raise ValueError(
            f"an unfinished rebuild of {job.generation} ({describe_scope(job.app, job.user)}, {job.model}) "
            f"is under way: resume it with `memq index rebuild{flags}`, or start over with --restart"
        )
    if exists and same and not restart:
        say(f"resuming the unfinished rebuild of {job.generation} ({describe_scope(app, user)}, {job.model})")
        return job
    live = await backend.live()
    if exists and (live is None or live.generation != job.generation):
        say(f"dropping the unfinished rebuild of {job.generation}, starting over")
        await backend.drop_generation(job.generation)
    await end_job(store, js, settings, job)
    return None


async def _start_job(store, js, settings, indexer, app, user) -> RebuildJob:
    backend: IndexBackend = indexer.backend
    live = await backend.live()
    scoped = app is not None or user is not None
    if scoped and live is None:
        raise ValueError("a scoped rebuild needs a live index to copy the rest from; rebuild everything first")
    target = await backend.create_generation(
        indexer.embedder.model, indexer.embedder.dim, min_similarity=floor_for(indexer.embedder.model)
    )
    log.info("rebuilding into %s (%s, source stream)", target.generation, target.model)
    job = RebuildJob(target.generation, target.model, target.dim, app=app, user=user, started_at=time.time())
    streams = event_streams(settings.streams)
    if scoped:
        # What the live generation holds for sure: on each stream, everything
        # up to its ack floor.
        for stream in streams:
            try:
                info = await js.consumer_info(stream, settings.indexing.durable)
            except NotFoundError:
                continue
            job.copied_upto[stream] = info.ack_floor.stream_seq if info.ack_floor else 0
        job.copied = await _copy_outside_scope(backend, target.generation, app, user, live, indexer)
    for stream in streams:
        await js.add_consumer(stream, consumer_config(settings, target.generation))
    await store.put(job)
    return job


async def _caught_up(js, settings, job: RebuildJob, progress: Progress | None, say: Notice) -> None:
    """Until the job's consumer on every events stream has nothing pending
    and nothing in flight. Progress counts messages over all of them (from
    each stream's first sequence: sequences are per stream)."""
    streams = event_streams(settings.streams)
    seen: tuple[int, ...] = ()
    since = time.monotonic()
    warned = False
    while True:
        done = total = pending = in_flight = 0
        delivered: list[int] = []
        for stream in streams:
            info = await js.consumer_info(stream, job.consumer)
            state = (await js.stream_info(stream)).state
            first, last = state.first_seq or 1, state.last_seq
            waiting, held = info.num_pending or 0, info.num_ack_pending or 0
            floor = (
                last if waiting == 0 and held == 0 else min(info.ack_floor.stream_seq if info.ack_floor else 0, last)
            )
            done += max(0, floor - first + 1)
            total += max(0, last - first + 1)
            pending, in_flight = pending + waiting, in_flight + held
            delivered.append(info.delivered.stream_seq if info.delivered else 0)
        if progress:
            progress(done, total)
        if pending == 0 and in_flight == 0:
            return
        if tuple(delivered) != seen:
            seen, since = tuple(delivered), time.monotonic()
        elif not warned and in_flight == 0 and time.monotonic() - since > STALLED_S:
            warned = True
            say(f"nothing has pulled from {job.consumer} for {STALLED_S:.0f}s: is an indexing worker running?")
        await asyncio.sleep(POLL_S)


async def _rebuild_sql(settings, js, indexer, app, user, engine, progress) -> RebuildResult:
    """The SQL source: this process alone, dropped on failure."""
    backend: IndexBackend = indexer.backend
    started = time.monotonic()
    scoped = app is not None or user is not None
    live = await backend.live()
    if scoped and live is None:
        raise ValueError("a scoped rebuild needs a live index to copy the rest from; rebuild everything first")
    if engine is None:
        raise ValueError("source sql needs a database engine")
    replays: list[StreamReplay] = []
    target = await backend.create_generation(
        indexer.embedder.model, indexer.embedder.dim, min_similarity=floor_for(indexer.embedder.model)
    )
    log.info("rebuilding into %s (%s, source sql)", target.generation, target.model)
    subjects = scope_filter(app, user)
    copied = replayed = 0
    docs_before = indexer.totals.docs
    try:
        if scoped:
            copied = await _copy_outside_scope(backend, target.generation, app, user, live, indexer)
        # SQL holds everything up to a stream's end once the persistence
        # floor of that stream reaches it; the tail replays each stream
        # after that point.
        for stream in event_streams(settings.streams):
            end = (await js.stream_info(stream)).state.last_seq
            await CommitFloor(js, stream, settings.persistence.durable).wait_for(end, COMMIT_WAIT_S)
            replays.append(StreamReplay(js, stream, subjects, start_seq=end + 1))
            await replays[-1].open()
        replayed = await _replay_sql(engine, indexer, target.generation, app, user, progress)
        await backend.promote(target.generation)
        # Tail: what arrived while we replayed went to the old generation only.
        for replay in replays:
            async for batch in replay.batches():
                await indexer.apply(indexer.decode(batch), generation=target.generation)
                replayed += len(batch)
    except BaseException:
        await _abandon(backend, replays, target.generation)
        raise
    for replay in replays:
        await replay.close()
    return RebuildResult(
        generation=target.generation,
        model=target.model,
        replayed=replayed,
        copied=copied,
        docs=indexer.totals.docs - docs_before,
        seconds=time.monotonic() - started,
    )


async def _abandon(backend: IndexBackend, replays: list[StreamReplay], generation: str) -> None:
    """Clean up after a failed or cancelled rebuild. A clean-up error is
    logged, never raised: it must not replace the original exception (a
    CancelledError turned into IndexUnavailable would make the worker retry
    instead of stop); what is left is dropped by the next rebuild."""
    try:
        for replay in replays:
            await replay.close()
        live = await backend.live()
        if live is None or live.generation != generation:
            await backend.drop_generation(generation)
    except Exception as exc:
        log.warning(
            "could not drop the unfinished index generation %s (%s); the next rebuild drops it", generation, exc
        )


async def _copy_outside_scope(backend, generation, app, user, live, indexer) -> int:
    if (live.model, live.dim) != (indexer.embedder.model, indexer.embedder.dim):
        raise ValueError(
            f"the live index holds {live.model} vectors and the embedder is {indexer.embedder.model}: "
            "a scoped rebuild cannot mix them; rebuild everything"
        )
    copied, batch = 0, []
    async for doc in backend.export():
        if in_scope(doc, app, user):
            continue
        batch.append(doc)
        if len(batch) >= FETCH:
            await backend.upsert(batch, generation=generation)
            copied, batch = copied + len(batch), []
    if batch:
        await backend.upsert(batch, generation=generation)
        copied += len(batch)
    return copied


async def _replay_sql(engine, indexer: Indexer, generation: str, app, user, progress) -> int:
    from memq.workers.sql import reads  # only the sql source needs SQL

    done = 0
    total = await reads.count_indexable(engine, app=app, user=user)
    async for rows in reads.indexable_messages(engine, app=app, user=user, page=FETCH):
        await indexer.apply(rows, generation=generation)
        done += len(rows)
        if progress:
            progress(done, max(total, done))
    return done
